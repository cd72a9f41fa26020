"""Checkpoints: the generic format and file handling, then the replay's tables on top."""

import errno
import hashlib
import json
import logging
import os
import pickle
import struct

import numpy as np
import pytest

from apexrl.common import checkpoint as generic
from apexrl.common.checkpoint import CorruptCheckpoint
from apexrl.replay import checkpoint as replay_checkpoint
from apexrl.replay.signature import ALLOWED_DTYPES, ColumnSpec
from apexrl.replay.table import Table

GENERIC_LOGGER = "apexrl.common.checkpoint"
KIND = "learner"


# --- generic: (meta, named arrays) -----------------------------------------------------


def make_arrays(seed: int = 0) -> dict[str, np.ndarray]:
    """Every wire dtype, odd sizes (so that padding is exercised), 0-d and empty arrays."""
    rng = np.random.default_rng(seed)
    arrays = {
        f"params/{dtype.str}": (rng.random((3, 5)) * 100).astype(dtype)
        for dtype in sorted(generic.DTYPES, key=lambda d: d.str)
    }
    arrays["params/bool"] = rng.random(7) < 0.5
    arrays["optimizer/step"] = np.array(17, dtype=np.int64)  # 0-d stays 0-d
    arrays["optimizer/empty"] = np.zeros((0, 4), dtype=np.float32)
    arrays['weird name/ with "quotes" and ünïcode'] = rng.random(2)
    arrays["strided"] = rng.random((6, 4)).astype(np.float32)[::2, ::-1]  # not contiguous
    arrays["last"] = rng.random(33).astype(np.float32)  # ends the file
    return arrays


META = {"step": 1234, "lr": 0.1 + 0.2, "nested": {"names": ["a", "b"], "none": None}}


def assert_same_arrays(loaded: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    assert list(loaded) == list(expected)
    for name, array in expected.items():
        assert loaded[name].dtype == array.dtype, name
        assert loaded[name].shape == array.shape, name
        assert loaded[name].tobytes() == array.tobytes(), name


def test_dtypes_are_the_replay_wire_dtypes():
    assert generic.DTYPES == ALLOWED_DTYPES
    assert len(generic.DTYPES) == 12


def test_generic_round_trip_and_layout(tmp_path):
    arrays = make_arrays()
    path, size = generic.write_checkpoint(tmp_path, KIND, META, arrays)
    assert path.name == "learner-000000000001.ckpt" and path.stat().st_size == size
    meta, loaded = generic.read_checkpoint(path, KIND)
    assert meta == META and meta["lr"] == 0.1 + 0.2  # floats round-trip exactly
    assert_same_arrays(loaded, arrays)
    assert loaded["optimizer/step"].shape == ()
    assert generic.checkpoints(tmp_path, KIND) == [(1, path)]

    loaded_path, meta2, loaded2 = generic.load_newest(tmp_path, KIND)
    assert loaded_path == path and meta2 == META
    assert_same_arrays(loaded2, arrays)

    data = path.read_bytes()
    assert data[:8] == b"APEXCKP1"
    (header_size,) = struct.unpack("<Q", data[8:16])
    header_bytes = data[16 : 16 + header_size]
    assert data[16 + header_size : 48 + header_size] == hashlib.sha256(header_bytes).digest()
    body_start = 48 + header_size
    assert body_start % 64 == 0
    header = json.loads(header_bytes)
    assert set(header) == {
        "format", "version", "kind", "sequence", "created_unix", "body_nbytes", "meta", "arrays"
    }  # fmt: skip
    assert (header["format"], header["version"], header["kind"]) == ("apexrl.checkpoint", 1, KIND)
    assert header["sequence"] == 1 and header["meta"] == META
    assert len(data) == body_start + header["body_nbytes"]
    for name, desc in header["arrays"].items():
        array = arrays[name].copy(order="C")
        assert desc["dtype"] == array.dtype.str and desc["shape"] == list(array.shape)
        assert desc["offset"] % 64 == 0 and desc["nbytes"] == array.nbytes
        raw = data[body_start + desc["offset"] : body_start + desc["offset"] + desc["nbytes"]]
        assert raw == array.tobytes() and hashlib.sha256(raw).hexdigest() == desc["sha256"]


def test_generic_keep_newest_two(tmp_path):
    arrays = make_arrays()
    paths = [generic.write_checkpoint(tmp_path, KIND, META, arrays)[0] for _ in range(4)]
    assert sorted(tmp_path.iterdir()) == paths[-2:]
    assert paths[-1].name == "learner-000000000004.ckpt"
    assert generic.checkpoints(tmp_path, KIND) == [(3, paths[2]), (4, paths[3])]
    generic.write_checkpoint(tmp_path, KIND, META, arrays, keep=1)
    assert [p.name for p in tmp_path.iterdir()] == ["learner-000000000005.ckpt"]
    with pytest.raises(ValueError, match="keep"):
        generic.write_checkpoint(tmp_path, KIND, META, arrays, keep=0)


def test_kinds_share_a_directory_independently(tmp_path):
    a = [generic.write_checkpoint(tmp_path, "replay", {"n": i}, {})[0] for i in range(3)]
    (tmp_path / ".replay-crashed.tmp").write_bytes(b"x")  # another kind's writer: kept
    b = [generic.write_checkpoint(tmp_path, KIND, {"n": i}, {}, keep=1)[0] for i in range(2)]
    assert [p for _, p in generic.checkpoints(tmp_path, "replay")] == a[-2:]
    assert [p for _, p in generic.checkpoints(tmp_path, KIND)] == b[-1:]
    assert b[-1].name == "learner-000000000002.ckpt"
    assert (tmp_path / ".replay-crashed.tmp").exists()
    assert generic.load_newest(tmp_path, "replay")[1] == {"n": 2}
    assert generic.load_newest(tmp_path, KIND)[1] == {"n": 1}


def test_kind_mismatch_is_corrupt(tmp_path):
    path, _ = generic.write_checkpoint(tmp_path, KIND, META, make_arrays())
    renamed = path.rename(tmp_path / "replay-000000000001.ckpt")
    with pytest.raises(CorruptCheckpoint, match="kind 'learner', expected 'replay'"):
        generic.read_checkpoint(renamed, "replay")


@pytest.mark.parametrize("kind", ["", "a-b", "../x", "a.b", "x*", "a" * 65, 3])
def test_bad_kind_is_refused(tmp_path, kind):
    with pytest.raises(ValueError, match="kind"):
        generic.write_checkpoint(tmp_path, kind, {}, {})
    with pytest.raises(ValueError, match="kind"):
        generic.checkpoints(tmp_path, kind)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "array",
    [
        np.zeros(3, dtype=">f4"),  # big-endian
        np.zeros(3, dtype=">i8"),
        np.zeros(3, dtype=object),
        np.zeros(3, dtype=np.complex128),
        np.zeros(3, dtype="datetime64[s]"),
        np.zeros(3, dtype=[("a", "<f4"), ("b", "<i4")]),  # structured
        np.array(["text"]),
    ],
)
def test_writer_refuses_non_wire_dtypes(tmp_path, array):
    generic.write_checkpoint(tmp_path, KIND, META, make_arrays())
    before = sorted(tmp_path.iterdir())
    with pytest.raises(ValueError, match="not a wire dtype"):
        generic.write_checkpoint(tmp_path, KIND, META, {"ok": np.zeros(2), "bad": array})
    assert sorted(tmp_path.iterdir()) == before  # nothing written, nothing pruned


def test_writer_refuses_non_json_meta(tmp_path):
    with pytest.raises(TypeError, match="meta"):
        generic.write_checkpoint(tmp_path, KIND, ["not", "a", "dict"], {})
    with pytest.raises(ValueError):  # NaN is not JSON
        generic.write_checkpoint(tmp_path, KIND, {"x": float("nan")}, {})
    with pytest.raises(TypeError):
        generic.write_checkpoint(tmp_path, KIND, {"x": object()}, {})
    with pytest.raises(TypeError, match="names"):
        generic.write_checkpoint(tmp_path, KIND, {}, {3: np.zeros(2)})
    assert generic.checkpoints(tmp_path, KIND) == []
    assert [p for p in tmp_path.iterdir() if p.suffix == ".tmp"] == []


def test_empty_directory(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger=GENERIC_LOGGER):
        assert generic.load_newest(tmp_path, KIND) is None
        assert generic.load_newest(tmp_path / "missing", KIND) is None
    assert caplog.records == []


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


DAMAGES = [
    (_truncate, "truncated"),
    (_flip_body_bit, "sha256 mismatch"),
    (_flip_header_bit, "header sha256"),
    (_bad_magic, "bad magic"),
    (_tiny, "truncated"),
]


@pytest.mark.parametrize(("damage", "reason"), DAMAGES)
def test_damaged_newest_falls_back_to_previous(tmp_path, caplog, damage, reason):
    old = make_arrays(seed=1)
    old_path, _ = generic.write_checkpoint(tmp_path, KIND, {"seed": 1}, old)
    new_path, _ = generic.write_checkpoint(tmp_path, KIND, {"seed": 2}, make_arrays(seed=2))
    damage(new_path)
    with pytest.raises(CorruptCheckpoint, match=reason):
        generic.read_checkpoint(new_path, KIND)
    with caplog.at_level(logging.WARNING, logger=GENERIC_LOGGER):
        path, meta, loaded = generic.load_newest(tmp_path, KIND)
    assert path == old_path and meta == {"seed": 1}
    assert_same_arrays(loaded, old)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert new_path.name in warnings[0].getMessage() and reason in warnings[0].getMessage()
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []


def test_all_damaged_logs_an_error_and_returns_none(tmp_path, caplog):
    paths = [generic.write_checkpoint(tmp_path, KIND, META, make_arrays())[0] for _ in range(2)]
    _flip_body_bit(paths[0])
    _truncate(paths[1])
    with caplog.at_level(logging.WARNING, logger=GENERIC_LOGGER):
        assert generic.load_newest(tmp_path, KIND) is None
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert paths[1].name in warnings[0] and "truncated" in warnings[0]
    assert paths[0].name in warnings[1] and "sha256 mismatch" in warnings[1]
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "no readable checkpoint among 2" in errors[0]


def _fail_writes(monkeypatch, fail_in):
    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    if fail_in == "fsync":
        monkeypatch.setattr(generic.os, "fsync", disk_full)
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

        monkeypatch.setattr(generic.os, "fdopen", fdopen)


@pytest.mark.parametrize("fail_in", ["write", "fsync"])
def test_failed_write_leaves_previous_intact(tmp_path, monkeypatch, fail_in):
    arrays = make_arrays()
    good_path, _ = generic.write_checkpoint(tmp_path, KIND, META, arrays)
    good_bytes = good_path.read_bytes()
    _fail_writes(monkeypatch, fail_in)
    with pytest.raises(OSError) as e:
        generic.write_checkpoint(tmp_path, KIND, {}, make_arrays(seed=5), keep=1)
    assert e.value.errno == errno.ENOSPC
    assert list(tmp_path.iterdir()) == [good_path]  # no temp file left, nothing pruned
    assert good_path.read_bytes() == good_bytes
    monkeypatch.undo()
    path, meta, loaded = generic.load_newest(tmp_path, KIND)
    assert path == good_path and meta == META
    assert_same_arrays(loaded, arrays)


def test_leftover_temp_files_are_removed(tmp_path):
    (tmp_path / ".learner-crashed.tmp").write_bytes(b"x" * 1000)
    path, _ = generic.write_checkpoint(tmp_path, KIND, META, make_arrays())
    assert list(tmp_path.iterdir()) == [path]


def test_every_cut_and_every_flipped_bit_is_refused_naming_the_file(tmp_path):
    # Odd sizes: every array is followed by padding, which no array checksum covers.
    arrays = {"a": np.arange(3, dtype=np.float32), "b": np.array(True), "c": np.arange(5.0)}
    old_path, _ = generic.write_checkpoint(tmp_path, KIND, {"n": 1}, arrays)
    path, _ = generic.write_checkpoint(tmp_path, KIND, {"n": 2}, arrays)
    intact = path.read_bytes()
    accepted = []
    damaged = [intact[:cut] for cut in range(len(intact))]
    damaged += [
        intact[:i] + bytes([intact[i] ^ (1 << bit)]) + intact[i + 1 :]
        for i in range(len(intact))
        for bit in range(8)
    ]
    with open(path, "r+b", buffering=0) as f:  # rewritten in place: replacing it is slow
        for data in damaged:
            f.seek(0)
            f.write(data)
            f.truncate(len(data))
            try:
                generic.read_checkpoint(path, KIND)
                accepted.append(data)
            except CorruptCheckpoint as err:
                assert str(path) in str(err)
    assert accepted == []  # the last flip stays: the previous one is restored
    assert generic.load_newest(tmp_path, KIND)[:2] == (old_path, {"n": 1})


def test_a_damaged_newest_checkpoint_never_pushes_a_readable_one_out(tmp_path):
    paths = [generic.write_checkpoint(tmp_path, KIND, {"n": n}, {})[0] for n in (1, 2)]
    _flip_header_bit(paths[1])
    assert generic.load_newest(tmp_path, KIND)[:2] == (paths[0], {"n": 1})
    newer, _ = generic.write_checkpoint(tmp_path, KIND, {"n": 3}, {})
    # Kept: the newest two readable ones; the damaged one is gone.
    assert sorted(tmp_path.iterdir()) == [paths[0], newer]
    _truncate(newer)  # the newest damaged too: the first one is still there to fall back to
    assert generic.load_newest(tmp_path, KIND)[:2] == (paths[0], {"n": 1})


@pytest.mark.parametrize("value", ["x", "0", "-1", "1.5", " 3"])
def test_kill_at_setting_must_be_a_positive_integer(value):
    with pytest.raises(ValueError, match=generic.KILL_AT_ENV):
        generic._kill_at({generic.KILL_AT_ENV: value})
    assert generic._kill_at({}) == 0 and generic._kill_at({generic.KILL_AT_ENV: "7"}) == 7


def _forge_header(path, old: bytes, new: bytes) -> None:
    """Edits the header and recomputes its sha256, as a malicious writer could."""
    data = path.read_bytes()
    (header_size,) = struct.unpack("<Q", data[8:16])
    header = data[16 : 16 + header_size]
    assert old in header
    header = header.replace(old, new, 1).rstrip(b" ")
    header += b" " * (-(48 + len(header)) % 64)  # the body stays aligned
    body = data[48 + header_size :]
    forged = struct.pack("<8sQ", data[:8], len(header)) + header
    path.write_bytes(forged + hashlib.sha256(header).digest() + body)


@pytest.mark.parametrize(
    ("old", "new", "reason"),
    [
        (b'"dtype": "|u1"', b'"dtype": "|O1"', "not allowed|malformed"),
        (b'"dtype": "|u1"', b'"dtype": "|O"', "not allowed"),
        (b'"dtype": "|u1"', b'"dtype": ">f4"', "not allowed"),
        (b'"dtype": "|u1"', b'"dtype": 7', "not allowed"),
        (b'"kind": "learner"', b'"kind": "replay"', "kind 'replay', expected 'learner'"),
        (b'"version": 1', b'"version": 2', "unknown format"),
        (b'"shape": [3, 5]', b'"shape": [3, -5]', "bad shape"),
        (b'"shape": [3, 5]', b'"shape": [3, 6]', "nbytes"),
        (b'"meta": {', b'"meta": [{', "malformed|meta"),
    ],
)
def test_reader_rejects_forged_headers(tmp_path, old, new, reason):
    # A header that passes its checksum but names an object dtype must not be read.
    path, _ = generic.write_checkpoint(tmp_path, KIND, META, make_arrays())
    _forge_header(path, old, new)
    with pytest.raises(CorruptCheckpoint, match=reason):
        generic.read_checkpoint(path, KIND)


def test_reading_never_unpickles(tmp_path, monkeypatch):
    path, _ = generic.write_checkpoint(tmp_path, KIND, META, make_arrays())

    def forbidden(*args, **kwargs):
        raise AssertionError("unpickling attempted")

    for name in ("load", "loads", "Unpickler"):
        monkeypatch.setattr(pickle, name, forbidden)
    monkeypatch.setattr(np, "load", forbidden)
    meta, arrays = generic.read_checkpoint(path, KIND)
    assert meta == META and all(a.dtype in generic.DTYPES for a in arrays.values())


# --- replay: TableState <-> (meta, arrays) ---------------------------------------------

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


def digests(loaded_states):
    return [Table.from_state(s).digest() for s in loaded_states]


def test_replay_round_trip(tmp_path):
    tables = make_tables()
    path, size = replay_checkpoint.write_checkpoint(tmp_path, states(tables))
    assert path.name == "replay-000000000001.ckpt" and path.stat().st_size == size
    assert replay_checkpoint.checkpoints(tmp_path) == [(1, path)]
    loaded_path, loaded = replay_checkpoint.load_newest(tmp_path)
    assert loaded_path == path
    assert digests(loaded) == [t.digest() for t in tables]
    assert digests(replay_checkpoint.read_checkpoint(path)) == [t.digest() for t in tables]
    with open(path, "rb") as f:
        assert f.read(8) == b"APEXCKP1"
        (header_size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_size))
        assert (16 + header_size + 32) % 64 == 0
    assert header["kind"] == "replay"
    assert [t["name"] for t in header["meta"]["tables"]] == ["a", "empty"]
    assert header["meta"]["tables"][0]["columns"] == ["obs", "action", "done", "half"]
    assert header["meta"]["tables"][1]["columns"] == []
    assert header["arrays"]["tables/0/columns/obs"]["shape"] == [16, 4, 4]
    assert header["arrays"]["tables/0/slot_keys"]["dtype"] == "<i8"
    assert set(header["arrays"]) == {
        "tables/0/slot_keys", "tables/0/priorities", "tables/0/columns/obs",
        "tables/0/columns/action", "tables/0/columns/done", "tables/0/columns/half",
        "tables/1/slot_keys", "tables/1/priorities",
    }  # fmt: skip


def test_replay_names_cannot_collide(tmp_path):
    # Table and column names with slashes: arrays are keyed by table index, not name.
    spec = [ColumnSpec("x/slot_keys", np.dtype(np.float32), ()), ColumnSpec("y", np.dtype("?"), ())]
    tricky = [Table("t", 4, signature=spec), Table("t/columns/x", 4, signature=spec)]
    for i, t in enumerate(tricky):
        t.insert({"x/slot_keys": np.full(2, i, np.float32), "y": np.ones(2, bool)}, np.ones(2))
    replay_checkpoint.write_checkpoint(tmp_path, states(tricky))
    _, loaded = replay_checkpoint.load_newest(tmp_path)
    assert digests(loaded) == [t.digest() for t in tricky]


def test_replay_round_trip_signature_without_items(tmp_path):
    # Columns of shape [0, 4, 4]: zero-size arrays with more than one dimension.
    tables = [Table("fresh", 8, alpha=0.5, signature=SIGNATURE)]
    assert tables[0].snapshot().columns["obs"].shape == (0, 4, 4)
    replay_checkpoint.write_checkpoint(tmp_path, states(tables))
    _, loaded = replay_checkpoint.load_newest(tmp_path)
    assert loaded[0].columns["obs"].shape == (0, 4, 4)
    assert digests(loaded) == [t.digest() for t in tables]


def test_replay_keep_newest_two(tmp_path):
    tables = make_tables()
    paths = [replay_checkpoint.write_checkpoint(tmp_path, states(tables))[0] for _ in range(4)]
    assert sorted(tmp_path.iterdir()) == paths[-2:]
    assert paths[-1].name == "replay-000000000004.ckpt"
    replay_checkpoint.write_checkpoint(tmp_path, states(tables), keep=1)
    assert [p.name for p in tmp_path.iterdir()] == ["replay-000000000005.ckpt"]


def test_replay_empty_directory(tmp_path):
    assert replay_checkpoint.load_newest(tmp_path) is None
    assert replay_checkpoint.load_newest(tmp_path / "missing") is None


@pytest.mark.parametrize(("damage", "reason"), DAMAGES)
def test_replay_damaged_newest_falls_back_to_previous(tmp_path, caplog, damage, reason):
    old = make_tables(seed=1)
    old_path, _ = replay_checkpoint.write_checkpoint(tmp_path, states(old))
    new_path, _ = replay_checkpoint.write_checkpoint(tmp_path, states(make_tables(seed=2)))
    damage(new_path)
    with pytest.raises(CorruptCheckpoint, match=reason):
        replay_checkpoint.read_checkpoint(new_path)
    with caplog.at_level(logging.WARNING, logger=GENERIC_LOGGER):
        path, loaded = replay_checkpoint.load_newest(tmp_path)
    assert path == old_path
    assert digests(loaded) == [t.digest() for t in old]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert new_path.name in warnings[0].getMessage() and reason in warnings[0].getMessage()


@pytest.mark.parametrize(
    ("meta", "arrays", "reason"),
    [
        ({"tables": [{"name": "a"}]}, {}, "malformed header"),  # checksummed, yet not ours
        ({}, {}, "malformed header"),
        ({"tables": []}, {"tables/0/slot_keys": np.zeros(3, np.int64)}, "unexpected"),
    ],
)
def test_replay_rejects_undecodable_checkpoints_and_falls_back(
    tmp_path, caplog, meta, arrays, reason
):
    old = make_tables(seed=1)
    old_path, _ = replay_checkpoint.write_checkpoint(tmp_path, states(old))
    bad_path, _ = generic.write_checkpoint(tmp_path, "replay", meta, arrays)
    with pytest.raises(CorruptCheckpoint, match=reason):
        replay_checkpoint.read_checkpoint(bad_path)
    with caplog.at_level(logging.WARNING, logger=GENERIC_LOGGER):
        path, loaded = replay_checkpoint.load_newest(tmp_path)
    assert path == old_path
    assert digests(loaded) == [t.digest() for t in old]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and bad_path.name in warnings[0] and reason in warnings[0]


def test_replay_missing_column_array_is_corrupt(tmp_path):
    path, _ = replay_checkpoint.write_checkpoint(tmp_path, states(make_tables()))
    meta, arrays = generic.read_checkpoint(path, "replay")
    del arrays["tables/0/columns/done"]
    bad, _ = generic.write_checkpoint(tmp_path, "replay", meta, arrays)
    with pytest.raises(CorruptCheckpoint, match="malformed header.*tables/0/columns/done"):
        replay_checkpoint.read_checkpoint(bad)


def test_replay_learner_checkpoint_is_not_a_replay_one(tmp_path):
    path, _ = generic.write_checkpoint(tmp_path, KIND, META, {})
    renamed = path.rename(tmp_path / "replay-000000000001.ckpt")
    with pytest.raises(CorruptCheckpoint, match="kind"):
        replay_checkpoint.read_checkpoint(renamed)
    assert replay_checkpoint.load_newest(tmp_path) is None


@pytest.mark.parametrize("fail_in", ["write", "fsync"])
def test_replay_failed_write_leaves_previous_intact(tmp_path, monkeypatch, fail_in):
    tables = make_tables()
    good_path, _ = replay_checkpoint.write_checkpoint(tmp_path, states(tables))
    good_bytes = good_path.read_bytes()
    _fail_writes(monkeypatch, fail_in)
    with pytest.raises(OSError) as e:
        replay_checkpoint.write_checkpoint(tmp_path, states(make_tables(seed=5)), keep=1)
    assert e.value.errno == errno.ENOSPC
    assert list(tmp_path.iterdir()) == [good_path]  # no temp file left, nothing pruned
    assert good_path.read_bytes() == good_bytes
    monkeypatch.undo()
    path, loaded = replay_checkpoint.load_newest(tmp_path)
    assert path == good_path
    assert Table.from_state(loaded[0]).digest() == tables[0].digest()


def test_replay_leftover_temp_files_are_removed(tmp_path):
    (tmp_path / ".replay-crashed.tmp").write_bytes(b"x" * 1000)
    path, _ = replay_checkpoint.write_checkpoint(tmp_path, states(make_tables()))
    assert list(tmp_path.iterdir()) == [path]


def test_replay_reader_rejects_disallowed_dtype(tmp_path):
    # A header that passes its checksum but names an object dtype must not be read.
    path, _ = replay_checkpoint.write_checkpoint(tmp_path, states(make_tables()))
    data = path.read_bytes()
    (header_size,) = struct.unpack("<Q", data[8:16])
    header = data[16 : 16 + header_size].replace(b'"dtype": "|u1"', b'"dtype": "|O1"', 1)
    forged = data[:16] + header + hashlib.sha256(header).digest() + data[48 + header_size :]
    path.write_bytes(forged)
    with pytest.raises(CorruptCheckpoint, match="not allowed|malformed"):
        replay_checkpoint.read_checkpoint(path)
