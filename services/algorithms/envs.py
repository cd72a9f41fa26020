"""Env construction, written once for actors, the evaluator and `apexrl eval`.

`env_spec` tells an algorithm what it acts on (observation and action spaces);
`make_vector_env` builds the vector env the actor steps, set up the way NStepAdder expects.

We use gymnasium's SAME_STEP autoreset. Under the default NEXT_STEP mode the
step after an episode end only resets that env (its action is ignored, reward
0), so the actor would have to recognise and skip those fake steps. Under
SAME_STEP every step is a real transition: an env whose episode ends is reset
within the same step, the returned obs is already the new episode's first obs,
and the final obs of the old episode is in infos["final_obs"] (an object array,
None for envs that did not end; mask infos["_final_obs"]).

Actor loop:

    envs, obs = make_vector_env(env_id, num_envs, seed)
    while True:
        actions = ...                                   # policy on obs
        next_obs, rewards, terminated, truncated, infos = envs.step(actions)
        batch = adder.add(obs, actions, rewards, terminated, truncated,
                          final_observations(next_obs, infos))
        obs = next_obs                                  # reset obs where an episode ended
"""

from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, SyncVectorEnv

# Histogram buckets for episode returns (actor and evaluator metrics): CartPole (0..500), Atari
# scores above. No negative bounds: prometheus_client drops a histogram's _sum when its lowest
# bound is negative, and the dashboards' mean returns are _sum / _count; negative returns
# (Acrobot, Pendulum) land in the first bucket and still count in _sum.
RETURN_BUCKETS = (0, 10, 25, 50, 100, 200, 300, 400, 475, 500, 1000, 5000, 20000)


@dataclass(frozen=True)
class EnvSpec:
    """What an algorithm needs to know of an env: its spaces."""

    env_id: str
    obs_shape: tuple[int, ...]
    obs_dtype: np.dtype
    num_actions: int  # Discrete spaces; 0 for continuous ones
    action_shape: tuple[int, ...]  # () for Discrete
    action_low: np.ndarray | None  # Box bounds (float32), None for Discrete
    action_high: np.ndarray | None

    @property
    def discrete(self) -> bool:
        return self.num_actions > 0


def make_env(env_id: str) -> gym.Env:
    """The one place an env is made (actors, evaluator, `apexrl eval`)."""
    return gym.make(env_id)


def env_spec(env_id: str) -> EnvSpec:
    env = make_env(env_id)
    try:
        obs, action = env.observation_space, env.action_space
    finally:
        env.close()
    if isinstance(action, gym.spaces.Discrete):
        return EnvSpec(env_id, obs.shape, obs.dtype, int(action.n), (), None, None)
    if isinstance(action, gym.spaces.Box):
        low, high = action.low.astype(np.float32), action.high.astype(np.float32)
        if not (np.isfinite(low).all() and np.isfinite(high).all()):
            raise ValueError(f"env {env_id}: unbounded action space {action}")
        return EnvSpec(env_id, obs.shape, obs.dtype, 0, action.shape, low, high)
    raise ValueError(f"env {env_id}: action space {action} is neither Discrete nor Box")


def make_vector_env(env_id: str, num_envs: int, seed: int) -> tuple[SyncVectorEnv, np.ndarray]:
    """A SAME_STEP-autoreset SyncVectorEnv, reset with seeds seed, seed+1, ...

    Returns (envs, first observations). The action space is seeded too.
    """
    envs = SyncVectorEnv(
        [lambda: make_env(env_id) for _ in range(num_envs)],
        autoreset_mode=AutoresetMode.SAME_STEP,
    )
    obs, _ = envs.reset(seed=seed)  # an int seed gives env i the seed seed + i
    envs.action_space.seed(seed)
    return envs, obs


def final_observations(next_obs: np.ndarray, infos: dict[str, Any]) -> np.ndarray:
    """next_obs with the final obs swapped in for envs whose episode just ended (a copy)."""
    result = np.array(next_obs, copy=True)
    if "final_obs" in infos:
        for i in np.flatnonzero(infos["_final_obs"]):
            result[i] = infos["final_obs"][i]
    return result
