"""An algorithm is its builder: one defined in tests/ (tests/algorithms/qlearning.py), which
services/ has never heard of, runs through local mode's real processes and learns CartPole."""

import os
import re
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from apexrl import algorithms

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
ALGORITHM = "tests.algorithms.qlearning:QLearningBuilder"
EPISODES = 30
FIRST_SEED = 1_000_000  # apexrl eval's default: seeds no evaluation used


def random_policy_mean() -> float:
    """A random policy's mean CartPole-v1 return on the seeds `apexrl eval` plays (~22)."""
    env, rng, returns = gym.make("CartPole-v1"), np.random.default_rng(0), []
    for k in range(EPISODES):
        env.reset(seed=FIRST_SEED + k)
        total, done = 0.0, False
        while not done:
            _, reward, terminated, truncated, _ = env.step(int(rng.integers(2)))
            total, done = total + reward, terminated or truncated
        returns.append(total)
    return float(np.mean(returns))


def test_an_algorithm_outside_services_learns_cartpole_through_local_mode(tmp_path):
    assert ALGORITHM not in algorithms.ALGORITHMS.values()  # not registered: found by its path
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "apexrl.cli", "local", "--algorithm", ALGORITHM, "--seed", "1",
         "--run-dir", str(run_dir), "--target-return", "150", "--max-seconds", "150"],
        capture_output=True, text=True, timeout=450, cwd=tmp_path, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    written = (run_dir / "config.toml").read_text()
    assert "[qlearning]" in written and 'sampler = "uniform"' in written  # its table, its sampler

    played = subprocess.run(
        [sys.executable, "-m", "apexrl.cli", "eval", "--checkpoint", str(run_dir / "checkpoints"),
         "--episodes", str(EPISODES)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env,
    )  # fmt: skip
    assert played.returncode == 0, played.stderr
    mean = re.search(rf"^mean (-?[\d.]+), .* over {EPISODES} episodes$", played.stdout, re.M)
    assert mean, played.stdout
    baseline = random_policy_mean()
    # The best model on unseen seeds, against a random policy's ~22 on the same seeds.
    assert float(mean.group(1)) > 3 * baseline, (mean.group(0), baseline)
