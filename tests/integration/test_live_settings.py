"""`apexrl set` against a real learner process training from a real replay: the change is kept
by the checkpoint written right after the update it came during, shown by the gauge, and a
learner killed with SIGKILL resumes with it. A refused
change exits non-zero, names the setting and changes nothing."""

import subprocess
import sys

from apexrl.common import checkpoint
from tests.conftest import metrics, wait_for

GAUGE = 'apexrl_learner_scheduled_setting{setting="learning_rate"}'


def apexrl_set(address: str, *words: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "apexrl.cli", "set", "--learner", address, *words],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def gauge(port: int) -> float | None:
    """The learning rate's gauge, as scraped (None: not exported)."""
    import urllib.request

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    lines = [line for line in text.splitlines() if line.startswith(GAUGE)]
    return float(lines[0].rsplit(" ", 1)[1]) if lines else None


def newest_live(ckpt) -> dict | None:
    found = checkpoint.checkpoints(ckpt, "learner")
    if not found:
        return None
    meta, _ = checkpoint.read_checkpoint(found[-1][1], "learner")
    return meta if meta.get("live_settings") else None


def test_a_learning_rate_change_reaches_the_learner_and_survives_a_kill(
    service_process, filled_replay, tmp_path
):
    ckpt = tmp_path / "learner"
    flags = ("--replay", filled_replay.address, "--checkpoint-dir", str(ckpt),
             "--checkpoint-interval", "0", "--batch-size", "32", "--learning-rate", "1e-3")  # fmt: skip
    learner = service_process("learner", *flags)
    wait_for(lambda: metrics(learner.metrics_port).get("apexrl_learner_update_step", 0) > 5, 60,
             "the learner training")  # fmt: skip
    assert gauge(learner.metrics_port) is None  # nothing scheduled, nothing changed yet
    refused = apexrl_set(learner.address, "batch_size=64")
    assert refused.returncode == 1
    assert "INVALID_ARGUMENT: batch_size: cannot change during a run" in refused.stderr
    done = apexrl_set(learner.address, "learning_rate=2.5e-4")
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip()
    assert line.startswith("learning_rate = 0.00025 from update ") and line.endswith("(was 0.001)")
    answered = int(line.split("from update ")[1].split()[0])
    meta = wait_for(lambda: newest_live(ckpt), 60, "a checkpoint with the change")
    assert meta["live_settings"] == {"learning_rate": 2.5e-4}
    # Kept by the checkpoint after the update it came during (answered <= its step); applied
    # from the next update on.
    assert answered <= meta["update_step"] <= answered + 2
    assert gauge(learner.metrics_port) == 2.5e-4
    learner.kill()  # SIGKILL: only what a checkpoint holds survives
    resumed = service_process("learner", *flags)
    assert gauge(resumed.metrics_port) == 2.5e-4  # over the flag's 1e-3
    assert "live change: learning_rate = 0.00025" in resumed.log()
    resumed.stop()
    assert newest_live(ckpt)["live_settings"] == {"learning_rate": 2.5e-4}


def test_a_changed_live_file_reaches_the_running_learner(service_process, filled_replay, tmp_path):
    """The file as a ConfigMap key is: rewritten whole while the learner runs."""
    live = tmp_path / "live.toml"
    live.write_text("learning_rate = 5e-4\n")
    learner = service_process("learner", "--replay", filled_replay.address, "--batch-size", "32",
                              "--live-file", str(live))  # fmt: skip
    wait_for(lambda: gauge(learner.metrics_port) == 5e-4, 30, "the file's rate")
    live.write_text("learning_rate = 2e-4\n")
    wait_for(lambda: gauge(learner.metrics_port) == 2e-4, 30, "the new rate")
    live.write_text("learning_rate = -1.0\n")
    failures = "apexrl_learner_live_file_failures_total"
    wait_for(lambda: metrics(learner.metrics_port).get(failures) == 1, 30, "a refused line")
    assert gauge(learner.metrics_port) == 2e-4
    assert "learning_rate: must be >= 0, got -1.0" in learner.log()
    learner.stop()


def test_a_live_file_the_learner_cannot_take_stops_it_at_start(filled_replay, tmp_path):
    live = tmp_path / "live.toml"
    live.write_text("max_grad_norm = 1.0\n")
    result = subprocess.run(
        [sys.executable, "-m", "apexrl.cli", "learner", "--replay", filled_replay.address,
         "--port", "0", "--metrics-port", "0", "--live-file", str(live)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2
    assert "max_grad_norm: cannot change during a run" in result.stderr
