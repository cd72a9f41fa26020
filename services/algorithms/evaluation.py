"""Playing a policy for whole episodes: the evaluator's rounds and `apexrl eval`."""

import numpy as np

from apexrl.algorithms.base import Policy
from apexrl.algorithms.envs import EnvOptions, make_vector_env


def evaluate(
    policy: Policy,
    env_id: str,
    episodes: int,
    seed: int,
    exploration: float = 0.0,
    options: EnvOptions = EnvOptions(),  # noqa: B008 (frozen)
) -> np.ndarray:
    """Returns of `episodes` episodes played at once, one per env (episode k on seed seed + k),
    by `policy` with `exploration` (0: its evaluation policy). Returns are the env's own
    rewards (an Atari game's score, never clipped)."""
    envs, obs = make_vector_env(env_id, episodes, seed, options)
    rng = np.random.default_rng(seed)
    returns = np.zeros(episodes)
    running = np.ones(episodes, bool)  # each env counts its first episode only
    while running.any():
        obs, rewards, terminated, truncated, _ = envs.step(policy.act(obs, exploration, rng))
        returns += rewards * running
        running &= ~(terminated | truncated)
    envs.close()
    return returns
