"""Fixed-length unrolls from a gymnasium vector env, for the on-policy algorithms.

Every `length` steps each env's last `length` steps become one item (the columns
`apexrl.algorithms.columns.unroll_columns` declares): observations [length + 1, *obs] (the
observation each step acted on, then the one after the last step, for the bootstrap value),
actions (a Gaussian policy's unclipped samples, its extras' "sampled_actions", where it gives
them), rewards, discounts, the behaviour log-probabilities, with `returns` each env's running
discounted return of the rewards (reset where an episode ends: what reward normalization's
statistics read, as VecNormalize's), and the version that acted.
Envs step together, so all emit at once; the next unroll starts at the observation this one
ended on, and runs on across episode ends (discount 0 there cuts every return).

A truncated episode (time limit) is not a terminal state: the caller adds gamma * V(final obs)
to that step's reward and gives it discount 0 (algorithms/impala/vtrace.py documents it).
"""

from collections.abc import Callable

import numpy as np

from apexrl.algorithms.base import Adder, Step


class UnrollAdder(Adder):
    """Unrolls of one version each, inserted as soon as they are made (a queue's learner waits
    for them)."""

    insert_at_once = True

    def __init__(
        self,
        num_envs: int,
        length: int,
        obs_shape,
        obs_dtype,
        *,
        gamma: float = 0.99,
        values: Callable | None = None,
        table: str = "default",
        action_shape: tuple[int, ...] = (),
        action_dtype=np.int64,
        returns: bool = False,
    ):
        self.table, self.gamma, self.values = table, gamma, values
        if num_envs < 1 or length < 1:
            raise ValueError(f"num_envs and length must be >= 1, got {num_envs}, {length}")
        self.length, self.t = length, 0
        self.obs = np.zeros((length + 1, num_envs, *obs_shape), obs_dtype)
        self.actions = np.zeros((length, num_envs, *action_shape), action_dtype)
        # the running discounted returns (None: not recorded)
        self.returns = np.zeros((length, num_envs), np.float32) if returns else None
        self.running = np.zeros(num_envs, np.float64)
        self.rewards = np.zeros((length, num_envs), np.float32)
        self.discounts = np.zeros((length, num_envs), np.float32)
        self.log_probs = np.zeros((length, num_envs), np.float32)

    @property
    def at_boundary(self) -> bool:
        """No unroll in progress: the place to change the parameters the actor acts with."""
        return self.t == 0

    def add(self, step: Step) -> dict[str, np.ndarray] | None:
        """`values` (the policy's V(obs)) bootstraps the truncated episodes' last rewards."""
        rewards, discounts = step_targets(
            step.rewards, step.ends, step.truncated, step.final_obs, self.values, self.gamma
        )
        if self.returns is not None:
            self.running = self.running * self.gamma + step.rewards
            self.returns[self.t] = self.running
            self.running[np.asarray(step.ends) | np.asarray(step.truncated)] = 0.0
        actions = step.extras.get("sampled_actions", step.actions)
        log_probs = step.extras["log_probs"]
        return self.record(
            step.obs, actions, log_probs, rewards, discounts, step.next_obs, step.version
        )

    def record(self, obs, actions, log_probs, rewards, discounts, next_obs, version: int):
        """One step of every env; returns the unrolls (a dict of batch-major columns, one row
        per env) when they are complete, else None."""
        t = self.t
        self.obs[t], self.actions[t], self.log_probs[t] = obs, actions, log_probs
        self.rewards[t], self.discounts[t] = rewards, discounts
        self.t += 1
        if self.t < self.length:
            return None
        self.obs[self.length] = next_obs
        self.t = 0
        items = {
            "observations": np.ascontiguousarray(self.obs.swapaxes(0, 1)),
            "actions": np.ascontiguousarray(self.actions.swapaxes(0, 1)),
            "rewards": self.rewards.T.copy(),
            "discounts": self.discounts.T.copy(),
            "log_probs": self.log_probs.T.copy(),
            "version": np.full(self.obs.shape[1], version, np.int64),
        }
        if self.returns is not None:
            items["returns"] = self.returns.T.copy()
        return items


def step_targets(rewards, ends, truncated, final_obs, values, gamma: float):
    """(rewards, discounts) float32 [B] of one step for the unrolls: discount gamma, 0 where the
    episode ended (`ends`: terminated, or a lost life) or was truncated; a truncated step's
    reward gets gamma * values(its final observation) added (the bootstrap the unroll's
    discount 0 cuts off). `values` is called only with the truncated envs' observations."""
    rewards = np.asarray(rewards, np.float32).copy()
    cut = np.asarray(truncated) & ~np.asarray(ends)
    if cut.any():
        rewards[cut] += np.float32(gamma) * np.asarray(values(final_obs[cut]), np.float32)
    return rewards, np.where(ends | cut, 0.0, gamma).astype(np.float32)
