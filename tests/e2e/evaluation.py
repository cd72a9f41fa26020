"""What the learning end-to-end tests share: a best model's mean return on unseen seeds, as
`apexrl eval` prints it, and a random policy's mean on the same seeds."""

import re
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np

FIRST_SEED = 1_000_000  # apexrl eval's default: seeds no evaluation used


def random_policy_mean(env_id: str, episodes: int) -> float:
    """A random policy's mean return on the seeds `apexrl eval` plays (CartPole: ~22)."""
    env, rng, returns = gym.make(env_id), np.random.default_rng(0), []
    for k in range(episodes):
        env.reset(seed=FIRST_SEED + k)
        total, done = 0.0, False
        while not done:
            _, reward, terminated, truncated, _ = env.step(int(rng.integers(env.action_space.n)))
            total, done = total + reward, terminated or truncated
        returns.append(total)
    return float(np.mean(returns))


def eval_mean(checkpoints: Path, episodes: int, cwd: Path, env: dict | None = None) -> tuple:
    """(mean return, its line) of `apexrl eval` on the best model in `checkpoints`."""
    played = subprocess.run(
        [sys.executable, "-m", "apexrl.cli", "eval", "--checkpoint", str(checkpoints),
         "--episodes", str(episodes)],
        capture_output=True, text=True, timeout=300, cwd=cwd, env=env,
    )  # fmt: skip
    assert played.returncode == 0, played.stderr
    mean = re.search(rf"^mean (-?[\d.]+), .* over {episodes} episodes$", played.stdout, re.M)
    assert mean, played.stdout
    return float(mean.group(1)), mean.group(0)
