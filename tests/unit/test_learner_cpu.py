"""Local mode's learner_cpu: the learner's child process runs on that CPU alone and every other
service's on the others, read back from the kernel (/proc/PID/status); a CPU it cannot have is
refused by name before the run folder is made."""

import os
import subprocess
import sys

import pytest

from apexrl.command_config import LocalConfig
from apexrl.local import run as local_run
from apexrl.local.supervision import child_setup, cpus_for

CPUS = sorted(os.sched_getaffinity(0))
two_cpus = pytest.mark.skipif(len(CPUS) < 2, reason="pinning needs two CPUs")


def allowed_cpus(pid: int) -> set[int]:
    """Cpus_allowed_list of /proc/PID/status, e.g. '0-1,3' -> {0, 1, 3}."""
    with open(f"/proc/{pid}/status") as fh:
        line = next(line for line in fh if line.startswith("Cpus_allowed_list:"))
    cpus: set[int] = set()
    for part in line.split(":")[1].strip().split(","):
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


@two_cpus
@pytest.mark.parametrize("name", ["learner", "actor-0", "replay"])
def test_a_child_runs_on_the_cpus_its_service_is_given(name):
    cpus = cpus_for(name, CPUS[0])
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"],
        stdin=subprocess.PIPE,
        preexec_fn=child_setup(cpus),
    )
    try:
        seen = allowed_cpus(child.pid)
    finally:
        child.communicate(b"")
    if name == "learner":
        assert seen == {CPUS[0]}
    else:
        assert seen == set(CPUS) - {CPUS[0]} and seen


def test_without_pinning_a_child_keeps_every_cpu():
    assert cpus_for("learner", -1) is None
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"],
        stdin=subprocess.PIPE,
        preexec_fn=child_setup(None),
    )
    try:
        assert allowed_cpus(child.pid) == set(CPUS)
    finally:
        child.communicate(b"")


def test_a_cpu_the_machine_lacks_is_refused_before_the_run_folder(tmp_path, capsys):
    run_dir = tmp_path / "run"
    code = local_run.main(["--learner-cpu", "4096", "--run-dir", str(run_dir)])
    assert code == 2
    assert "learner_cpu: 4096" in capsys.readouterr().err
    assert not run_dir.exists()
    with pytest.raises(ValueError, match="learner_cpu"):
        cpus_for("actor-0", max(CPUS) + 1)
    assert LocalConfig().learner_cpu == -1
