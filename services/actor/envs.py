"""Vector envs for the actor, set up the way NStepAdder expects.

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

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, SyncVectorEnv


def make_vector_env(env_id: str, num_envs: int, seed: int) -> tuple[SyncVectorEnv, np.ndarray]:
    """A SAME_STEP-autoreset SyncVectorEnv, reset with seeds seed, seed+1, ...

    Returns (envs, first observations). The action space is seeded too.
    """
    envs = SyncVectorEnv(
        [lambda: gym.make(env_id) for _ in range(num_envs)],
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
