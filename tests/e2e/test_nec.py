"""nec through local mode's real processes: the actors act on the published embedding and DNDs,
the best model played by `apexrl eval` on unseen seeds beats a random policy, and the learner's
state (its DNDs and both optimizers) is checkpointed when local mode stops it."""

import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

EPISODES = 20
RANDOM_MEAN = 22.0  # a random policy's CartPole-v1 mean (tests/e2e/test_algorithm_outside.py)


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
    played = subprocess.run(
        [sys.executable, "-m", "apexrl.cli", "eval", "--checkpoint", str(run_dir / "checkpoints"),
         "--episodes", str(EPISODES)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert played.returncode == 0, played.stderr
    mean = re.search(rf"^mean (-?[\d.]+), .* over {EPISODES} episodes$", played.stdout, re.M)
    assert mean, played.stdout
    assert float(mean.group(1)) > 3 * RANDOM_MEAN, mean.group(0)
