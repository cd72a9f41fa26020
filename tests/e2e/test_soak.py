"""The soak, short: local mode on CartPole for 150 s while a nemesis kills the replay
and the learner, (as root) cuts the replay off and pauses the learner, then random faults, 5-10 s
apart; benchmarks/soak.py's checker must find nothing acknowledged lost, no version going back, no
best model getting worse and CartPole solved again after the learner's restart.

The 10- and 60-minute runs (the nemesis 20-40 s and 1-3 minutes apart): docs/benchmarks.md;
the resource slopes need windows longer than this test.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SOAK = Path(__file__).resolve().parents[2] / "benchmarks" / "soak.py"


def partition_possible() -> bool:
    return os.geteuid() == 0 and all(shutil.which(tool) for tool in ("ip", "nft"))


@pytest.mark.timeout(480)
def test_a_short_soak_loses_nothing_acknowledged(tmp_path):
    script = ["kill:replay", "kill:learner"]
    faults = "kill,pause"
    if partition_possible():
        script.append("partition:replay")
        faults += ",partition"
    script.append("pause:learner")
    command = [sys.executable, str(SOAK), "--soak-overall-timeout-seconds", "150",
               "--nemesis-interval", "5", "10", "--pause-seconds", "5", "10",
               "--replay-checkpoint-interval", "5", "--learner-checkpoint-interval", "5",
               "--faults", faults, "--script", ",".join(script),
               "--run-dir", str(tmp_path / "run")]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=420)
    assert result.stdout, result.stderr[-3000:]
    report = json.loads(result.stdout.splitlines()[-1])
    summary = json.dumps({k: v for k, v in report.items() if k != "settings"}, indent=1)
    assert result.returncode == 0 and report["passed"], summary + result.stderr[-3000:]
    # The faults scripted first, as far as the time allowed (the first two at least).
    done = [f"{i['fault']}:{i['target']}" for i in report["iterations"]]
    assert len(done) >= 2 and done[: len(script)] == script[: len(done)], summary
    assert all(i["recovered"] for i in report["iterations"]), summary
    replay = report["checks"]["replay-0"]
    assert replay["acknowledged"] > 100 and replay["in_final_table"] > 0, summary
    # Read back: the checkpoint each restart restored, then the final one.
    assert replay["tables_read"] == done.count("kill:replay") + 1, summary
    assert report["checks"]["versions"]["lineages"] >= 2, summary
    learner_kill = report["iterations"][1]
    assert learner_kill["games"] and learner_kill["games"][-1]["mean_return"] >= 475, summary
