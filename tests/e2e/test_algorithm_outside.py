"""An algorithm is its builder: one defined in tests/ (tests/algorithms/qlearning.py), which
services/ has never heard of, runs through local mode's real processes and learns CartPole."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from apexrl import algorithms
from tests.e2e.evaluation import eval_mean, random_policy_mean

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
ALGORITHM = "tests.algorithms.qlearning:QLearningBuilder"
EPISODES = 30


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

    mean, line = eval_mean(run_dir / "checkpoints", EPISODES, tmp_path, env)
    baseline = random_policy_mean("CartPole-v1", EPISODES)
    # The best model on unseen seeds, against a random policy's ~22 on the same seeds.
    assert mean > 3 * baseline, (line, baseline)
