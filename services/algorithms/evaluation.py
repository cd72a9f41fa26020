"""Playing a policy for whole episodes: the evaluator's rounds and `apexrl eval`."""

import threading

import numpy as np

from apexrl.algorithms.base import Policy
from apexrl.algorithms.envs import EnvOptions, make_env


class Stopped(Exception):
    """The caller's stop was set while its episodes were being played."""


def evaluate(
    policy: Policy,
    env_id: str,
    episodes: int,
    seed: int,
    exploration: float = 0.0,
    options: EnvOptions = EnvOptions(),  # noqa: B008 (frozen)
    stop: threading.Event | None = None,
) -> np.ndarray:
    """Returns of `episodes` episodes played at once, one per env (episode k on seed seed + k),
    by `policy` with `exploration` (0: its evaluation policy). Returns are the env's own
    rewards (an Atari game's score, never clipped).

    The envs whose episode is still running step together (one batched policy call a step);
    an env whose episode ended steps no more. (A vector env would step them all to the end
    of the longest episode: twice the env steps for CartPole's early policies.)

    Raises Stopped once `stop` is set (a stopping evaluator does not finish its round)."""
    envs = [make_env(env_id, options) for _ in range(episodes)]
    rng = np.random.default_rng(seed)
    try:
        obs = [env.reset(seed=seed + k)[0] for k, env in enumerate(envs)]
        returns = np.zeros(episodes)
        running = list(range(episodes))
        policy.episode_starts(np.ones(episodes, bool))
        while running:
            if stop is not None and stop.is_set():
                raise Stopped(f"stopped with {len(running)} of {episodes} episodes running")
            actions = policy.act(np.stack([obs[k] for k in running]), exploration, rng)
            still = []
            for k, action in zip(running, actions, strict=True):
                obs[k], reward, terminated, truncated, _ = envs[k].step(action)
                returns[k] += reward
                if not (terminated or truncated):
                    still.append(k)
            if len(still) < len(running):
                policy.keep_envs(np.flatnonzero(np.isin(running, still)))
            running = still
        return returns
    finally:
        for env in envs:
            env.close()
