"""`apexrl local` end to end: it learns CartPole, writes its run folder, leaves nothing behind."""

import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests.conftest import wait_for

pytestmark = pytest.mark.slow


def leftover_processes(marker: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any(marker in part for part in proc.info["cmdline"] or []):
                found.append(proc)
        except psutil.Error:
            pass
    return found


def test_local_mode_solves_cartpole(tmp_path):
    run_dir = tmp_path / "run"
    # A generous budget: on this 2-core machine it usually solves in well under a minute.
    result = subprocess.run(
        [sys.executable, "-m", "apexrl.cli", "local", "--run-dir", str(run_dir), "--max-seconds", "400",
         "--seed", "1"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    last_line = result.stdout.strip().splitlines()[-1]
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert last_line.startswith("solved in ") and "env steps" in last_line
    for name in ("config.toml", "metrics.csv", "learning_curve.png"):
        assert (run_dir / name).stat().st_size > 0
    assert list((run_dir / "checkpoints").glob("learner-*.ckpt"))
    assert not leftover_processes(str(run_dir))
    for name in ("replay", "learner", "actor-0", "actor-1", "evaluator"):
        assert "stopped" in (run_dir / "logs" / f"{name}.log").read_text(), name

    played = subprocess.run(
        [sys.executable, "-m", "apexrl.cli", "eval", "--checkpoint", str(run_dir / "checkpoints"),
         "--episodes", "5"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert played.returncode == 0, played.stderr
    assert "mean" in played.stdout and "over 5 episodes" in played.stdout


def test_local_mode_stops_every_child_on_sigint(tmp_path):
    run_dir = tmp_path / "run"
    local = subprocess.Popen(
        [sys.executable, "-m", "apexrl.cli", "local", "--run-dir", str(run_dir), "--target-return", "1e9"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        csv = run_dir / "metrics.csv"
        wait_for(
            lambda: csv.exists() and len(csv.read_text().splitlines()) > 2, 120, "progress rows"
        )
        assert len(leftover_processes(str(run_dir))) >= 6  # local + 5 services
        local.send_signal(signal.SIGINT)
        output, _ = local.communicate(timeout=120)
    finally:
        if local.poll() is None:
            local.kill()
    assert local.returncode == 130
    assert output.strip().splitlines()[-1] == "not solved: interrupted"
    deadline = time.monotonic() + 10
    while leftover_processes(str(run_dir)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not leftover_processes(str(run_dir))
