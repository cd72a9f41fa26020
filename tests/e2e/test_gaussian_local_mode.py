"""`apexrl local` with Gaussian policies on Pendulum-v1: ppo solves it, and the normalizers'
statistics go from the learner through the published parameters to the actors, the evaluator,
the checkpoints and `apexrl eval`."""

import subprocess
import sys

import numpy as np
import pytest

from apexrl.common import checkpoint
from tests.e2e.test_local_mode import PENDULUM_TARGET, play_unseen

pytestmark = pytest.mark.slow

# benchmarks/time_to_solve.py --task pendulum-ppo: docs/benchmarks.md has the figures; the
# budget leaves room for a busier machine.
BUDGET = 240


def local(run_dir, *flags: str, budget: float = BUDGET) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "apexrl.cli",
            "local",
            "--env",
            "Pendulum-v1",
            "--run-dir",
            str(run_dir),
            "--max-seconds",
            str(budget),
            "--seed",
            "1",
            *flags,
        ],
        capture_output=True,
        text=True,
        timeout=budget + 300,
    )
    assert result.returncode in (0, 1), result.stdout[-3000:] + result.stderr[-3000:]
    return result


def test_local_mode_solves_pendulum_with_a_gaussian_ppo(tmp_path):
    run_dir = tmp_path / "run"
    result = local(run_dir, "--algorithm", "ppo")
    assert result.stdout.strip().splitlines()[-1].startswith("solved in "), result.stdout[-2000:]
    _, meta, arrays = checkpoint.load_newest(run_dir / "checkpoints", "best")
    assert meta["mean_return"] >= PENDULUM_TARGET
    assert arrays["online/gaussian.log_std"].shape == (64, 1)  # the preset's gSDE: sigma
    _, mean = play_unseen(run_dir)
    assert mean >= 1.25 * PENDULUM_TARGET  # Pendulum's returns spread wide (test_local_mode.py)


def test_normalizer_statistics_travel_with_the_parameters(tmp_path):
    """impala with both normalizers for 20 s: the learner's statistics at its exit checkpoint
    are those of the observations it trained on, and `apexrl eval` plays the checkpoint with
    them. Pendulum observes (cos, sin, angular velocity): cos^2 + sin^2 = 1 on every step, so
    the two first means and variances must satisfy var + mean^2 summed = 1 whatever the policy
    did (the prior, mean 0 and variance 1, sums to 2); the angular velocity, within [-8, 8],
    spreads wider than cos and sin do under any policy that has not learnt to stand still in
    20 s."""
    run_dir = tmp_path / "run"
    local(
        run_dir,
        "--algorithm",
        "impala",
        "--normalize-observations",
        "--normalize-rewards",
        "--target-return",
        "1e9",
        budget=20,
    )
    _, meta, arrays = checkpoint.load_newest(run_dir / "checkpoints", "learner")
    consumed = meta["samples_consumed"] * 64  # unrolls of 64 steps
    count = float(arrays["online/obs_norm.count"][0])
    assert count == pytest.approx(consumed, rel=1e-3) and count > 10_000
    mean, variance = arrays["online/obs_norm.mean"], arrays["online/obs_norm.var"]
    assert float((variance[:2] + mean[:2] ** 2).sum()) == pytest.approx(1.0, rel=1e-3)
    assert variance[2] > max(variance[:2]) and variance[2] > 1.0
    assert float(arrays["online/return_norm.count"][0]) == pytest.approx(consumed, rel=1e-3)
    assert np.sqrt(arrays["online/return_norm.var"][0]) > 5.0  # returns of rewards in [-16, 0]
    played = subprocess.run(
        [
            sys.executable,
            "-m",
            "apexrl.cli",
            "eval",
            "--checkpoint",
            str(run_dir / "checkpoints"),
            "--latest",
            "--episodes",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert played.returncode == 0, played.stderr
