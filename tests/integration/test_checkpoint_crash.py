"""Crash at any byte: a process killed (SIGKILL) inside a checkpoint write leaves the previous
complete checkpoint or the new one, never a mix, and a restarted service restores exactly that.

A fast subset of benchmarks/checkpoint_crash.py (its docstring has the design): the generic
writer killed at every crash point, the replay and learner processes at every (or every
few) crash points of a write, and damaged files through a restarted replay. The full 200+
trials with random kill timings: `.venv/bin/python benchmarks/checkpoint_crash.py`.
"""

import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from apexrl.common import checkpoint

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
KIND = "learner"

WRITER = """
import sys
import numpy as np
from apexrl.common import checkpoint
arrays = {f"w{i}": np.full(5 + i, float(sys.argv[2]), np.float32) for i in range(3)}
checkpoint.write_checkpoint(sys.argv[1], "learner", {"n": int(sys.argv[2])}, arrays, keep=2)
"""


def write_in_process(directory: Path, n: int, kill_at: int) -> int:
    """Writes checkpoint n in a fresh Python process killed at crash point kill_at."""
    env = {k: v for k, v in os.environ.items() if k != checkpoint.KILL_AT_ENV}
    if kill_at:
        env[checkpoint.KILL_AT_ENV] = str(kill_at)
    command = [sys.executable, "-c", WRITER, str(directory), str(n)]
    return subprocess.run(command, env=env, timeout=60).returncode


def files(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in directory.iterdir()}


@pytest.mark.slow
def test_writer_killed_at_every_crash_point_leaves_the_previous_or_the_new_checkpoint(tmp_path):
    base = tmp_path / "base"
    for n in (1, 2):  # two complete ones: the write of 3 prunes one
        assert write_in_process(base, n, 0) == 0
    before = files(base)
    outcomes = []
    point = 0
    while True:
        point += 1
        directory = shutil.copytree(base, tmp_path / f"point-{point}")
        code = write_in_process(directory, 3, point)
        if code == 0:  # past the last crash point
            break
        assert code == -9, f"crash point {point}: exit code {code}"
        for name, sha in files(directory).items():  # nothing complete changed
            assert name not in before or before[name] == sha, f"point {point}: {name} changed"
        found = checkpoint.load_newest(directory, KIND)
        assert found is not None, f"point {point}: nothing readable"
        _, meta, arrays = found
        assert meta["n"] in (2, 3), f"point {point}: restored {meta}"
        for array in arrays.values():
            np.testing.assert_array_equal(array, np.full(array.shape, meta["n"], np.float32))
        for _, path in checkpoint.checkpoints(directory, KIND):
            checkpoint.read_checkpoint(path, KIND)  # no torn file under a final name
        outcomes.append(meta["n"])
        checkpoint.write_checkpoint(directory, KIND, {"n": 4}, {})  # clears the leftovers
        assert not [p for p in directory.iterdir() if p.name.endswith(".tmp")]
    assert len(outcomes) >= 10 and set(outcomes) == {2, 3}
    assert outcomes == sorted(outcomes)  # "new" from the rename on, never before


@pytest.fixture
def crash_bench(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import checkpoint_crash

    return checkpoint_crash


def assert_clean(results, parts: list[str]) -> None:
    report = json.dumps({p: dict(c) for p, c in results.outcomes.items()})
    assert results.failures == [], f"{results.failures} {report}"
    for part in parts:
        assert set(results.outcomes[part]) == {"previous", "new"}, report


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_replay_killed_at_every_crash_point_restores_the_previous_or_the_new(crash_bench, tmp_path):
    results = crash_bench.Results()
    report = crash_bench.replay_points(tmp_path, 1, results)
    assert report["crash_points_per_write"][0] >= 15
    assert_clean(results, ["replay-points"])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_learner_killed_before_and_after_the_rename_resumes_the_previous_then_the_new(
    crash_bench, tmp_path
):
    results = crash_bench.Results()
    replay = crash_bench.filled_replay(tmp_path)
    try:
        crash_bench.learner_points(tmp_path, replay.address, 0, results, around_rename=True)
    finally:
        replay.kill()
    assert_clean(results, ["learner-points"])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_replay_refuses_a_cut_or_flipped_checkpoint_and_restores_the_previous(
    crash_bench, tmp_path
):
    results = crash_bench.Results()
    report = crash_bench.damage(tmp_path, 60, 30, results, random.Random(0))
    assert report["trials"]["through a server"] == 2
    assert results.failures == [] and results.outcomes["damage"] == {"previous": 60}
    assert results.outcomes["damage-restart"] == {"previous": 2}
