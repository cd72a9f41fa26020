"""The rewards the actors learn from: the env's, shaped by the reward settings (AgentConfig's
termination_reward, reward_potential, reward_scale, reward_offset, reward_clip).

Only what the actors store changes: every return reported (actor metrics, the evaluator, "solved",
`apexrl eval`) stays the env's own. In this order, per step:

    r = clip(r, -1, 1)                          Atari (EnvSpec.clip_rewards), as before
    r = r + termination_reward                  where the env terminated (not a truncation)
    r = r + gamma * phi(s') - phi(s)            phi(s') = 0 where the learnt episode ends
    r = r * reward_scale + reward_offset
    r = clip(r, -reward_clip, reward_clip)     where reward_clip > 0

gamma is the agent's discount (AgentConfig.gamma, the one the algorithm learns with), so the
shaping is potential-based (Ng, Harada and Russell 1999): it leaves the optimal policy as it
is. s' of a truncated step is its final observation, not the next episode's first. The
potential takes the observations of all envs at once ([B, ...]) and returns B numbers.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from apexrl.config import import_callable


@dataclass(frozen=True)
class RewardShaping:
    """The shaping of one actor's rewards (of(config, clip_atari) from its settings)."""

    termination_reward: float = 0.0
    potential: Callable[[np.ndarray], Any] | None = None
    gamma: float = 0.99
    scale: float = 1.0
    offset: float = 0.0
    clip: float = 0.0  # 0: none
    clip_atari: bool = False  # the game's rewards clipped to [-1, 1] first

    @classmethod
    def of(cls, config, clip_atari: bool = False) -> "RewardShaping":
        """From an AgentConfig (or a superset); `clip_atari`: EnvSpec.clip_rewards."""
        potential = None
        if config.reward_potential:
            potential = import_callable(config.reward_potential, "reward_potential")
        return cls(
            config.termination_reward,
            potential,
            config.gamma,
            config.reward_scale,
            config.reward_offset,
            config.reward_clip,
            clip_atari,
        )

    def __call__(
        self,
        rewards: np.ndarray,
        obs: np.ndarray,
        final_obs: np.ndarray,
        terminated: np.ndarray,
        ends: np.ndarray,
    ) -> np.ndarray:
        """The learnt rewards (float32 [B]) of one vector-env step: the env's `rewards` for
        acting on `obs`, `final_obs` the observations after it (the last ones of episodes that
        ended), `terminated` the env's flags, `ends` where the learnt episodes end (terminated,
        or a life lost)."""
        learnt = np.asarray(rewards, np.float64)
        if self.clip_atari:
            learnt = np.clip(learnt, -1.0, 1.0)
        if self.plain:  # the defaults: 0.8 us an 8-env step instead of 12
            return learnt.astype(np.float32)
        learnt = learnt + np.where(terminated, self.termination_reward, 0.0)
        if self.potential is not None:
            after = np.where(ends, 0.0, self.phi(final_obs))
            learnt = learnt + self.gamma * after - self.phi(obs)
        learnt = learnt * self.scale + self.offset
        if self.clip:
            learnt = np.clip(learnt, -self.clip, self.clip)
        return learnt.astype(np.float32)

    @property
    def plain(self) -> bool:
        """Nothing to do but Atari's clip (the settings' defaults)."""
        unshaped = self.potential is None and self.termination_reward == 0
        return unshaped and self.scale == 1 and self.offset == 0 and not self.clip

    def phi(self, obs: np.ndarray) -> np.ndarray:
        """The potential of each observation (ValueError naming the setting for an answer that
        is not one finite number per observation)."""
        assert self.potential is not None
        values = np.asarray(self.potential(obs), np.float64)
        if values.shape != (len(obs),) or not np.isfinite(values).all():
            raise ValueError(
                f"reward_potential: must return {len(obs)} finite numbers for observations of"
                f" shape {obs.shape}, returned {values.shape} {values.ravel()[:4]}"
            )
        return values
