"""`apexrl pbt` with real processes: a population of 2 on CartPole, an exploit round every
0.5 s; the first copy is the winner's checkpoint bit for bit with the winner's learning rate
perturbed, the loser's new learner restores exactly it, the lineage says so, and SIGTERM
stops every member and exits 0."""

import json
import signal
import subprocess
import sys

import numpy as np

from apexrl.common import checkpoint
from tests.conftest import wait_for
from tests.e2e.test_local_mode import leftover_processes

CONFIG = """
[learner]
checkpoint_interval = 2.0

[pbt]
population = 2
interval = 0.5
resample_probability = 0.0

[[pbt.explore]]
setting = "learning_rate"
values = [1e-2, 1e-5]
"""


def lineage(folder) -> list[dict]:
    path = folder / "lineage.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_loser_goes_on_from_the_winners_checkpoint_with_its_rate_perturbed(tmp_path):
    folder = tmp_path / "population"
    (tmp_path / "pbt.toml").write_text(CONFIG)
    command = [
        sys.executable,
        "-m",
        "apexrl.cli",
        "pbt",
        "--config",
        str(tmp_path / "pbt.toml"),
        "--run-dir",
        str(folder),
        "--actors",
        "1",
        "--seed",
        "5",
        "--max-seconds",
        "120",
    ]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        copy = wait_for(
            lambda: next((e for e in lineage(folder) if e["copied_from"]), None), 90, "a copy"
        )
        # The source as the winner's learner wrote it (read at once: it keeps its newest two).
        source_meta, source = checkpoint.read_checkpoint(copy["source"], "learner")
        meta, copied = checkpoint.read_checkpoint(copy["path"], "learner")
        log = folder / copy["member"] / "logs" / "learner.log"
        wait_for(lambda: log.exists() and "resumed from" in log.read_text(), 60, "the restore")
    finally:
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=120)
    assert process.returncode == 0, output[-3000:]
    assert "not solved: interrupted" in output or "solved in" in output, output[-3000:]
    assert not leftover_processes(str(folder))

    starts = {e["member"]: e["settings"] for e in lineage(folder) if not e["copied_from"]}
    assert set(starts) == {"member-0", "member-1"} and copy["member"] != copy["copied_from"]
    assert copy["source"].startswith(str(folder / copy["copied_from"] / "checkpoints"))
    assert copy["scores"][copy["member"]] < copy["scores"][copy["copied_from"]]
    # The copy is the winner's state bit for bit, its rate the winner's times the factor,
    # held inside the values' bounds.
    assert set(copied) == set(source)
    assert all(np.array_equal(copied[name], source[name]) for name in source)
    assert (meta["version"], meta["update_step"]) == (source_meta["version"], copy["update_step"])
    factor = float(copy["explore"]["learning_rate"].removeprefix("x"))
    rate = min(max(starts[copy["copied_from"]]["learning_rate"] * factor, 1e-5), 1e-2)
    assert factor in (0.8, 1.2) and copy["settings"]["learning_rate"] == rate
    assert meta["live_settings"]["learning_rate"] == rate
    # The loser's new learner restored exactly that file and took the rate.
    restored = log.read_text()
    assert f"resumed from {copy['path']}: update {copy['update_step']}" in restored
    assert f"live change: learning_rate = {rate:g}" in restored
