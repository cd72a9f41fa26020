import errno
import hashlib
import json
import logging
import os
import struct

import numpy as np
import pytest

from apexrl.replay import checkpoint
from apexrl.replay.checkpoint import (
    CorruptCheckpoint,
    load_newest,
    read_checkpoint,
    write_checkpoint,
)
from apexrl.replay.table import ColumnSpec, Table

SIGNATURE = [
    ColumnSpec("obs", np.dtype(np.uint8), (4, 4)),
    ColumnSpec("action", np.dtype(np.int64), ()),
    ColumnSpec("done", np.dtype(bool), ()),
    ColumnSpec("half", np.dtype(np.float16), (2,)),
]


def make_tables(seed: int = 0) -> list[Table]:
    rng = np.random.default_rng(seed)
    a = Table("a", 16, alpha=0.6, signature=SIGNATURE, seed=seed)
    for _ in range(3):
        n = 7
        a.insert(
            {
                "obs": rng.integers(0, 256, (n, 4, 4), dtype=np.uint8),
                "action": rng.integers(-5, 5, n),
                "done": rng.random(n) < 0.5,
                "half": rng.random((n, 2)).astype(np.float16),
            },
            rng.random(n),
        )
    a.sample(5, 0.4)
    a.update_priorities(np.array([3, 10, 20]), np.array([0.0, 2.0, 9.5]))
    empty = Table("empty", 3, alpha=0.0)  # no signature yet
    return [a, empty]


def states(tables):
    return [t.snapshot() for t in tables]


def test_round_trip(tmp_path):
    tables = make_tables()
    path, size = write_checkpoint(tmp_path, states(tables))
    assert path.name == "replay-000000000001.ckpt" and path.stat().st_size == size
    loaded_path, loaded = load_newest(tmp_path)
    assert loaded_path == path
    assert [Table.from_state(s).digest() for s in loaded] == [t.digest() for t in tables]
    with open(path, "rb") as f:
        assert f.read(8) == b"APEXRPL1"
        (header_size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_size))
        assert (16 + header_size + 32) % 64 == 0
    assert header["tables"][0]["arrays"]["columns"]["obs"]["shape"] == [16, 4, 4]


def test_keep_newest_two(tmp_path):
    tables = make_tables()
    paths = [write_checkpoint(tmp_path, states(tables))[0] for _ in range(4)]
    assert sorted(tmp_path.iterdir()) == paths[-2:]
    assert paths[-1].name == "replay-000000000004.ckpt"
    write_checkpoint(tmp_path, states(tables), keep=1)
    assert [p.name for p in tmp_path.iterdir()] == ["replay-000000000005.ckpt"]


def test_empty_directory(tmp_path):
    assert load_newest(tmp_path) is None
    assert load_newest(tmp_path / "missing") is None


def _truncate(path):
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 100)


def _flip_body_bit(path):
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x10  # the last array ends the file
    path.write_bytes(bytes(data))


def _flip_header_bit(path):
    data = bytearray(path.read_bytes())
    data[40] ^= 0x01
    path.write_bytes(bytes(data))


def _bad_magic(path):
    data = bytearray(path.read_bytes())
    data[0:8] = b"NOTREPLY"
    path.write_bytes(bytes(data))


def _tiny(path):
    path.write_bytes(b"APEX")


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (_truncate, "truncated"),
        (_flip_body_bit, "sha256 mismatch"),
        (_flip_header_bit, "header sha256"),
        (_bad_magic, "bad magic"),
        (_tiny, "truncated"),
    ],
)
def test_damaged_newest_falls_back_to_previous(tmp_path, caplog, damage, reason):
    old = make_tables(seed=1)
    old_path, _ = write_checkpoint(tmp_path, states(old))
    new_path, _ = write_checkpoint(tmp_path, states(make_tables(seed=2)))
    damage(new_path)
    with pytest.raises(CorruptCheckpoint, match=reason):
        read_checkpoint(new_path)
    with caplog.at_level(logging.WARNING, logger="apexrl.replay.checkpoint"):
        path, loaded = load_newest(tmp_path)
    assert path == old_path
    assert [Table.from_state(s).digest() for s in loaded] == [t.digest() for t in old]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert new_path.name in warnings[0].getMessage() and reason in warnings[0].getMessage()


@pytest.mark.parametrize("fail_in", ["write", "fsync"])
def test_failed_write_leaves_previous_intact(tmp_path, monkeypatch, fail_in):
    tables = make_tables()
    good_path, _ = write_checkpoint(tmp_path, states(tables))
    good_bytes = good_path.read_bytes()

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    if fail_in == "fsync":
        monkeypatch.setattr(checkpoint.os, "fsync", disk_full)
    else:
        # Fail on the first large array write, midway through the file.
        real_fdopen = os.fdopen

        def fdopen(*args, **kwargs):
            f = real_fdopen(*args, **kwargs)
            real_write = f.write

            def write(data):
                if len(data) > 100:
                    disk_full()
                return real_write(data)

            f.write = write
            return f

        monkeypatch.setattr(checkpoint.os, "fdopen", fdopen)
    with pytest.raises(OSError) as e:
        write_checkpoint(tmp_path, states(make_tables(seed=5)), keep=1)
    assert e.value.errno == errno.ENOSPC
    assert list(tmp_path.iterdir()) == [good_path]  # no temp file left, nothing pruned
    assert good_path.read_bytes() == good_bytes
    monkeypatch.undo()
    path, loaded = load_newest(tmp_path)
    assert path == good_path
    assert Table.from_state(loaded[0]).digest() == tables[0].digest()


def test_leftover_temp_files_are_removed(tmp_path):
    (tmp_path / ".replay-crashed.tmp").write_bytes(b"x" * 1000)
    path, _ = write_checkpoint(tmp_path, states(make_tables()))
    assert list(tmp_path.iterdir()) == [path]


def test_reader_rejects_disallowed_dtype(tmp_path):
    # A header that passes its checksum but names an object dtype must not be read.
    path, _ = write_checkpoint(tmp_path, states(make_tables()))
    data = path.read_bytes()
    (header_size,) = struct.unpack("<Q", data[8:16])
    header = data[16 : 16 + header_size].replace(b'"dtype": "|u1"', b'"dtype": "|O1"', 1)
    forged = data[:16] + header + hashlib.sha256(header).digest() + data[48 + header_size :]
    path.write_bytes(forged)
    with pytest.raises(CorruptCheckpoint, match="not allowed|malformed"):
        read_checkpoint(path)
