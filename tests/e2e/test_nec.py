"""nec through local mode's real processes: the actors act on the published embedding and DNDs,
the best model played by `apexrl eval` on unseen seeds beats a random policy, and the learner's
state (its DNDs and both optimizers) is checkpointed when local mode stops it."""

import subprocess
import sys

import pytest

from tests.e2e.evaluation import eval_mean, random_policy_mean

pytestmark = pytest.mark.slow

EPISODES = 20


def test_nec_learns_cartpole_and_checkpoints_its_dictionaries(tmp_path):
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "apexrl.cli", "local", "--algorithm", "nec", "--seed", "2",
         "--run-dir", str(run_dir), "--target-return", "100", "--max-seconds", "120"],
        capture_output=True, text=True, timeout=400, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    written = (run_dir / "config.toml").read_text()
    assert "[nec]" in written and 'sampler = "uniform"' in written
    assert list((run_dir / "checkpoints").glob("learner-*.ckpt")), "no learner checkpoint"
    mean, line = eval_mean(run_dir / "checkpoints", EPISODES, tmp_path)
    baseline = random_policy_mean("CartPole-v1", EPISODES)
    assert mean > 3 * baseline, (line, baseline)
