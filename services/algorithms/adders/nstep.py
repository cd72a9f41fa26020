"""N-step transitions from a gymnasium vector env, for all envs at once.

Every step starts one new window per env. Each pending window keeps its start
obs and action, the discounted return so far and its length m. After a step a
window is emitted when it is full (m == n) or when its env's episode ended; then

    reward   = sum_{k<m} gamma^k r_{t+k}
    discount = gamma^m * (1 - terminated)   (truncation keeps the bootstrap)
    next_obs = the obs after the last step of the window (the episode's final
               obs when it ended)

so partial windows at an episode end are emitted, not dropped, and the learner
needs neither n nor gamma.

Feed it steps of an env made by `apexrl.algorithms.envs.make_vector_env`, which
uses gymnasium's SAME_STEP autoreset: every step is a real transition and the
final obs of an ending episode comes in `infos["final_obs"]`
(`apexrl.algorithms.envs.final_observations` swaps it in: Step.final_obs). The columns it emits
are the ones `apexrl.algorithms.base.nstep_columns` declares; actions keep the
dtype and shape they come in (int64 indices, or float32 vectors). Windows are kept in a
ring of n slots per env, indexed by start step mod n; the full window that
must be emitted is always the one whose slot the next step reuses.

Where the policy's step gives the Q-value of each action it took (extras "acting_q" [num_envs]:
dqn's), each transition carries the one of its first step as "acting_q", which only the
initial priorities read (`acting_fields`: replay does not store it), so that the actor need
not run its network over the transition's obs again (Ape-X's actors compute priorities from
the values they acted on).
"""

from typing import ClassVar

import numpy as np

from apexrl.algorithms.base import Adder, Step


class NStepAdder(Adder):
    """Turns per-step vector-env data into n-step transition columns."""

    acting_fields: ClassVar[tuple[str, ...]] = ("acting_q",)

    def __init__(self, num_envs: int, n: int, gamma: float, table: str = "default"):
        self.table = table
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {gamma}")
        self.num_envs = num_envs
        self.n = n
        self.gamma = gamma
        self._gamma_pow = gamma ** np.arange(n + 1, dtype=np.float64)
        self._step = 0
        # Per (env, slot): the window started at a step t with t % n == slot.
        self._obs: np.ndarray | None = None  # allocated on first add, from the obs dtype/shape
        self._action: np.ndarray | None = None  # likewise, from the actions
        self._return = np.zeros((num_envs, n), dtype=np.float64)
        self._length = np.zeros((num_envs, n), dtype=np.int64)
        self._active = np.zeros((num_envs, n), dtype=bool)
        self._acting_q = np.zeros((num_envs, n), dtype=np.float32)

    def add(self, step: Step) -> dict[str, np.ndarray] | None:
        return self.record(
            step.obs,
            step.actions,
            step.rewards,
            step.ends,
            step.truncated,
            step.final_obs,
            step.extras.get("acting_q"),
        )

    def record(
        self,
        obs: np.ndarray,
        actions: np.ndarray,
        rewards: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        next_obs_or_final: np.ndarray,
        acting_q: np.ndarray | None = None,
    ) -> dict[str, np.ndarray] | None:
        """Records one vector-env step; returns the transitions it completed, or None.

        obs: the obs the actions were taken in; next_obs_or_final: the obs after
        the step, or the final obs for envs whose episode ended (not the reset obs);
        acting_q: the Q-value of each action taken, where the policy gives it.
        Returned columns are obs, action, reward, discount, next_obs (and acting_q), sorted
        by env then start step.
        """
        obs = np.asarray(obs)
        next_obs = np.asarray(next_obs_or_final)
        actions = np.asarray(actions)
        rewards = np.asarray(rewards, dtype=np.float64)
        terminated = np.asarray(terminated, dtype=bool)
        done = terminated | np.asarray(truncated, dtype=bool)
        if obs.shape[0] != self.num_envs or actions.shape[:1] != (self.num_envs,):
            raise ValueError(
                f"expected {self.num_envs} envs, got obs {obs.shape} and actions {actions.shape}"
            )
        if next_obs.shape != obs.shape:
            raise ValueError(f"next_obs shape {next_obs.shape} differs from obs shape {obs.shape}")
        if self._obs is None or self._action is None:
            self._obs = np.zeros((self.num_envs, self.n, *obs.shape[1:]), dtype=obs.dtype)
            shape = (self.num_envs, self.n, *actions.shape[1:])
            self._action = np.zeros(shape, dtype=actions.dtype)

        # Open this step's window in every env.
        slot = self._step % self.n
        self._obs[:, slot] = obs
        self._action[:, slot] = actions
        self._return[:, slot] = 0.0
        self._length[:, slot] = 0
        self._active[:, slot] = True
        if acting_q is not None:
            self._acting_q[:, slot] = acting_q
        self._step += 1

        # Every open window gains this step's reward, discounted by its current length.
        active = self._active
        self._return += np.where(active, self._gamma_pow[self._length] * rewards[:, None], 0.0)
        self._length += active

        emit = active & ((self._length == self.n) | done[:, None])
        if not emit.any():
            return None
        env_idx, slot_idx = np.nonzero(emit)
        # Oldest window first within each env: age counts back from the slot just opened.
        age = (slot - slot_idx) % self.n
        order = np.lexsort((-age, env_idx))
        env_idx, slot_idx = env_idx[order], slot_idx[order]

        length = self._length[env_idx, slot_idx]
        batch = {
            "obs": self._obs[env_idx, slot_idx],
            "action": self._action[env_idx, slot_idx],
            "reward": self._return[env_idx, slot_idx].astype(np.float32),
            "discount": (self._gamma_pow[length] * ~terminated[env_idx]).astype(np.float32),
            "next_obs": next_obs[env_idx],
        }
        if acting_q is not None:
            batch["acting_q"] = self._acting_q[env_idx, slot_idx]
        self._active[env_idx, slot_idx] = False
        return batch

    def pending(self) -> int:
        """Number of open windows (transitions not yet emitted)."""
        return int(self._active.sum())
