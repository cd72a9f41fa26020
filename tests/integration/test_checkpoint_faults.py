"""Damaged checkpoints and full disks, with replay and learner as real processes.

The newest checkpoint damaged (a flipped byte, or cut short): the service detects it by its
checksums, says so in its log and starts from the previous one. A disk that fills up (a small
tmpfs, needs root): the write fails, the previous checkpoint stays intact, the service goes on.
A checkpoint fallen back to or kept must restore what was saved: the replay table's digest
when the checkpoint was written, the parameters the learner served when it wrote it.
"""

import errno
import os
import shutil
import subprocess
from functools import partial
from pathlib import Path

import grpc
import numpy as np
import pytest

from apexrl.common import checkpoint
from apexrl.common.learner_client import LearnerClient
from apexrl.replay.client import ReplayClient
from tests.conftest import metric, require_root_feature, transitions, wait_for
from tests.integration.test_replay_process import digest

SAVED_STEP = 20  # a multiple of the learner's publish interval (10): served at that step


def damage(path: Path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    else:  # one bit flipped in the middle of the array data
        data[len(data) * 3 // 4] ^= 0x01
        path.write_bytes(data)


@pytest.mark.parametrize("how", ["flipped", "truncated"])
def test_replay_starts_from_the_previous_checkpoint_when_the_newest_is_damaged(
    replay_process, tmp_path, how
):
    ckpt = tmp_path / "ckpt"
    flags = ("--checkpoint-dir", str(ckpt), "--checkpoint-interval", "0", "--capacity", "1000")
    proc = replay_process(*flags)
    with ReplayClient(proc.address) as client:
        client.insert(transitions(300))
        client.checkpoint()
        previous = digest(client)
        client.insert(transitions(300, start=300))
        client.checkpoint()
    proc.kill()
    (_, older), (_, newest) = checkpoint.checkpoints(ckpt, "replay")
    damage(newest, how)
    restarted = replay_process(*flags)
    with ReplayClient(restarted.address) as client:
        assert digest(client) == previous
        assert client.info().size == 300
    log = restarted.log()
    assert f"skipping damaged checkpoint {newest}" in log and "trying the previous one" in log
    assert f"restored table 'default' from {older}" in log
    restarted.stop()


@pytest.mark.parametrize("how", ["flipped", "truncated"])
def test_learner_resumes_from_the_previous_checkpoint_when_the_newest_is_damaged(
    service_process, filled_replay, tmp_path, how
):
    ckpt = tmp_path / "learner"
    replay = filled_replay
    # Checkpoints only on SIGTERM, after training stopped at --max-updates: each one holds the
    # parameters the learner was serving then, recorded here as what was saved.
    flags = ("--replay", replay.address, "--checkpoint-dir", str(ckpt),
             "--checkpoint-interval", "0", "--batch-size", "32")  # fmt: skip
    saved = {}
    for step in (SAVED_STEP, 2 * SAVED_STEP):
        learner = service_process("learner", *flags, "--max-updates", str(step))
        with LearnerClient(learner.address) as client:
            saved[step] = wait_for(partial(served_at, client, step), 60, f"update {step}")
        learner.stop()
    (_, older), (_, newest) = checkpoint.checkpoints(ckpt, "learner")
    meta, arrays = checkpoint.read_checkpoint(older, "learner")
    damage(newest, how)
    resumed = service_process("learner", *flags, "--max-updates", str(meta["update_step"]))
    log = resumed.log()
    assert f"skipping damaged checkpoint {newest}" in log and "trying the previous one" in log
    assert f"resumed from {older}" in log
    with LearnerClient(resumed.address) as client:
        params = client.get_parameters()
    assert (params.update_step, params.version) == (meta["update_step"], meta["version"])
    assert params.update_step == SAVED_STEP
    assert params.arrays.keys() == saved[SAVED_STEP].arrays.keys()
    for name, value in params.arrays.items():
        np.testing.assert_array_equal(value, arrays[f"online/{name}"])
        np.testing.assert_array_equal(value, saved[SAVED_STEP].arrays[name])
    resumed.stop()
    replay.stop()


def served_at(client: LearnerClient, step: int):
    """The parameters the learner serves, once they are those of update `step` (else None)."""
    params = client.get_parameters()
    return params if params.update_step == step else None


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs, unmounted afterwards. Needs root (CI runs as root)."""
    require_root_feature(None if os.geteuid() == 0 else "mounting a tmpfs needs root")
    mount = tmp_path / "small-disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


def fill(disk: Path) -> bool:
    """Appends to a filler file until the disk is full (space freed since is taken again)."""
    with open(disk / "filler", "ab", buffering=0) as f:
        try:
            while f.write(b"\0" * 4096):
                pass
        except OSError as err:
            assert err.errno == errno.ENOSPC
    return True


def files(directory: Path) -> set[str]:
    return {p.name for p in directory.iterdir()}


def copy_into(path: Path, directory: Path) -> Path:
    directory.mkdir()
    return Path(shutil.copy2(path, directory / path.name))


def test_replay_keeps_serving_and_its_checkpoint_when_the_disk_is_full(
    replay_process, small_disk, tmp_path
):
    # The digest covers the configured rate limiter: every restart uses the same table flags.
    table = ("--capacity", "2000", "--min-size-to-sample", "1")
    proc = replay_process("--checkpoint-dir", str(small_disk), "--checkpoint-interval", "0", *table)
    age = "apexrl_replay_checkpoint_age_seconds"
    with ReplayClient(proc.address, retry_seconds=0) as client:
        client.insert(transitions(1000))
        assert metric(proc.metrics_port, age) == -1  # none yet
        client.checkpoint()
        assert 0 <= metric(proc.metrics_port, age) < 60
        saved = digest(client)
        ((_, kept),) = checkpoint.checkpoints(small_disk, "replay")
        fill(small_disk)
        before = files(small_disk)
        client.insert(transitions(1000, start=1000))
        with pytest.raises(grpc.RpcError) as caught:
            client.checkpoint()
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "checkpoint_dir" in caught.value.details()
        assert "previous checkpoints kept" in caught.value.details()
        assert files(small_disk) == before  # no partial file left behind
        assert checkpoint.read_checkpoint(kept, "replay")  # checksums still hold
        # ... and it restores the table as it was saved: a replay started from a copy of it.
        copy = copy_into(kept, tmp_path / "kept")
        from_kept = replay_process("--checkpoint-dir", str(copy.parent), *table)
        with ReplayClient(from_kept.address) as other:
            assert digest(other) == saved
        assert f"restored table 'default' from {copy}" in from_kept.log()
        from_kept.kill()
        assert "checkpoint failed, previous ones kept" in proc.log()
        assert metric(proc.metrics_port, "apexrl_replay_checkpoint_failures_total") == 1
        assert metric(proc.metrics_port, age) >= 0  # the age of the last one that held
        # Still serving: inserts and samples go on.
        assert client.insert(transitions(10, start=2000)).first_key == 2000
        assert len(client.sample(16).keys) == 16
        (small_disk / "filler").unlink()  # space again: the next checkpoint works
        client.checkpoint()
        written = digest(client)
    proc.kill()
    restarted = replay_process("--checkpoint-dir", str(small_disk), *table)
    with ReplayClient(restarted.address) as client:
        assert digest(client) != saved and client.info().inserts == 2010
        assert digest(client) == written
    restarted.stop()


def test_learner_keeps_training_and_its_checkpoint_when_the_disk_is_full(
    service_process, filled_replay, small_disk
):
    replay = filled_replay
    learner = service_process("learner", "--replay", replay.address, "--checkpoint-dir",
                              str(small_disk), "--checkpoint-interval", "0.3",
                              "--batch-size", "32")  # fmt: skip
    wait_for(lambda: checkpoint.checkpoints(small_disk, "learner"), 60, "a first checkpoint")

    def failures() -> float:
        return metric(learner.metrics_port, "apexrl_learner_checkpoint_failures_total")

    # Topped up while waiting: a checkpoint being written when the disk filled frees its space.
    wait_for(lambda: fill(small_disk) and failures() >= 1, 60, "a failed checkpoint")
    fill(small_disk)
    with LearnerClient(learner.address) as client:
        failed, step = failures(), client.get_parameters().update_step
        wait_for(lambda: failures() >= failed + 2, 60, "more failed checkpoints")
        kept = checkpoint.checkpoints(small_disk, "learner")
        wait_for(lambda: failures() >= failed + 3, 60, "one more failed checkpoint")
        assert client.get_parameters().update_step > step  # training goes on
    assert learner.process.poll() is None
    assert "checkpoint failed, previous ones kept" in learner.log()
    assert checkpoint.checkpoints(small_disk, "learner") == kept  # nothing replaced or pruned
    for _, path in kept:
        checkpoint.read_checkpoint(path, "learner")  # intact: checksums hold
    (small_disk / "filler").unlink()
    newest = kept[-1][0]
    wait_for(
        lambda: checkpoint.checkpoints(small_disk, "learner")[-1][0] > newest, 30, "checkpointing"
    )
    learner.stop()
    replay.stop()
