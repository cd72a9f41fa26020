"""A table with a compressed column: frames stored as they came, bytes accounted, checked
cheaply on insert, checkpointed and restored exactly."""

import sys

import numpy as np
import pytest

from apexrl.common import codec
from apexrl.common.codec import Packed
from apexrl.common.errors import InvalidArgument
from apexrl.replay import checkpoint
from apexrl.replay.signature import ColumnSpec, parse_signature
from apexrl.replay.snapshot import CHUNK
from apexrl.replay.storage import PACKED_ITEM_OVERHEAD
from apexrl.replay.table import Table
from tests.unit.test_codec import frames

SHAPE = (2, 4, 84, 84)


def table(capacity: int = 8) -> Table:
    return Table(
        "t",
        capacity,
        signature=parse_signature("observations:uint8:2x4x84x84:zstd,action:int64:"),
        seed=1,
    )


def batch(n: int, start: int = 0) -> tuple[dict, np.ndarray]:
    items = frames(n, SHAPE, seed=start)
    return {"observations": codec.compress(items), "action": np.arange(start, start + n)}, items


def test_signature_declares_the_codec():
    spec = parse_signature("observations:uint8:2x4x84x84:zstd")[0]
    assert spec == ColumnSpec("observations", np.uint8, SHAPE, codec="zstd")
    assert ColumnSpec.from_json(spec.to_json()) == spec
    with pytest.raises(ValueError, match="codec 'lz5'"):
        ColumnSpec("x", np.uint8, (4,), codec="lz5")


def test_frames_come_back_as_inserted_and_bytes_are_counted():
    t = table()
    columns, items = batch(6)
    t.insert(columns)
    sizes = columns["observations"].sizes
    per_item = 8 + 8 + 16 + 8 + PACKED_ITEM_OVERHEAD  # key, priority, tree, action, frame object
    assert t.stored_bytes == 6 * per_item + int(sizes.sum())
    result = t.sample(8, 0.4)
    packed = result.columns["observations"]
    assert isinstance(packed, Packed) and len(packed) == 8
    out, ok = codec.decompress(packed)
    assert ok.all()
    np.testing.assert_array_equal(out, items[result.columns["action"]])
    # FIFO eviction takes the evicted frames' bytes off.
    more, _ = batch(6, start=6)
    t.insert(more)
    stored = list(sizes[4:]) + list(more["observations"].sizes)
    assert t.stored_bytes == 8 * per_item + int(sum(stored))


@pytest.mark.parametrize(
    "bad, message",
    [
        (lambda c: c | {"observations": frames(2, SHAPE)}, "must be compressed with zstd"),
        (
            lambda c: c | {"observations": Packed.join("zstd", np.uint8, SHAPE, [b"x" * 9] * 2)},
            "item 0 is not a zstd frame declaring its size",
        ),
        (
            lambda c: c | {"observations": codec.compress(frames(2, (2, 4, 84, 85)))},
            r"items must be uint8 \[2, 4, 84, 84\], got uint8 \[2, 4, 84, 85\]",
        ),
        (
            lambda c: (
                c
                | {
                    "observations": Packed.join(
                        "zstd", np.uint8, SHAPE, codec.compress(frames(2, (2, 4, 84, 168))).items()
                    )
                }
            ),
            "item 0 declares 112896 decompressed bytes, the column's items have 56448",
        ),
        (
            lambda c: c | {"action": Packed.join("zstd", np.int64, (), [b"x"] * 2)},
            "is compressed but the column is not",
        ),
    ],
)
def test_bad_frames_are_refused_naming_the_column_and_change_nothing(bad, message):
    t = table()
    t.insert(batch(3)[0])
    before = t.digest()
    with pytest.raises(InvalidArgument, match=message) as err:
        t.insert(bad(batch(2, start=3)[0]))
    assert 'batch.columns["' in err.value.field
    assert t.digest() == before


def test_checkpoint_restores_frames_exactly(tmp_path):
    t = table(capacity=5)
    played = {}
    for start in (0, 4):
        columns, items = batch(4, start)
        t.insert(columns)
        played |= dict(zip(columns["action"].tolist(), items, strict=True))
    t.sample(3, 0.4)
    path, _ = checkpoint.write_checkpoint(tmp_path, [t.snapshot()])
    (state,) = checkpoint.read_checkpoint(path)
    restored = Table.from_state(state)
    assert restored.digest() == t.digest()
    assert restored.stored_bytes == t.stored_bytes
    result = restored.sample(5, 0.4)
    out, ok = codec.decompress(result.columns["observations"])
    assert ok.all()
    for action, item in zip(result.columns["action"], out, strict=True):
        np.testing.assert_array_equal(item, played[action])


def test_a_column_named_as_the_tables_own_arrays_survives_a_checkpoint(tmp_path):
    """A snapshot keeps the table's arrays (priorities, slot_keys, times_sampled) apart from
    its columns: columns of those names restore as inserted, beside the table's own."""
    signature = parse_signature("priorities:float32:,slot_keys:int32:,times_sampled:uint8:")
    t = Table("t", 8, max_times_sampled=3, signature=signature)
    columns = {
        "priorities": np.arange(5, dtype=np.float32) - 9,
        "slot_keys": np.arange(5, dtype=np.int32) + 100,
        "times_sampled": np.full(5, 7, np.uint8),
    }
    t.insert(columns, np.arange(1.0, 6.0))
    t.sample(2, 0.4)
    path, _ = checkpoint.write_checkpoint(tmp_path, [t.snapshot()])
    (state,) = checkpoint.read_checkpoint(path)
    restored = Table.from_state(state)
    assert restored.digest() == t.digest()
    for name, values in columns.items():
        np.testing.assert_array_equal(restored.columns[name][:5], values)


def test_digest_sees_a_changed_frame():
    a, b = table(), table()
    columns, _ = batch(3)
    a.insert(columns)
    other = columns | {"observations": codec.compress(frames(3, SHAPE, seed=9))}
    b.insert(other)
    assert a.digest() != b.digest()


def test_an_inserts_frames_share_one_object_freed_when_all_are_overwritten():
    t = table(capacity=4)
    first, _ = batch(4)
    blob = first["observations"].data
    t.insert(first)
    store = t.columns["observations"]
    assert all(b is blob for b in store.blobs)  # one object for the insert's 4 frames
    held = sys.getrefcount(blob)
    t.insert(batch(2, start=4)[0])
    assert sys.getrefcount(blob) == held - 2  # two of its slots overwritten
    t.insert(batch(2, start=6)[0])
    assert sys.getrefcount(blob) == held - 4  # no slot refers to it: it is freed with `first`


def test_a_snapshot_taken_chunk_by_chunk_is_the_table_as_it_began():
    """Inserts (wrapping around) and priority updates between the chunks of a snapshot do
    not leak into it: restored, it equals the table at the snapshot's start, byte for byte."""
    capacity = 2 * CHUNK + 100
    t = Table(
        "t", capacity, signature=parse_signature("observations:uint8:2x4x8x8:zstd,action:int64:")
    )
    items = np.zeros((256, 2, 4, 8, 8), np.uint8)
    for start in range(0, capacity + 500, 256):
        items[:, 0, 0, 0, 0] = start % 251
        t.insert(
            {"observations": codec.compress(items), "action": np.arange(start, start + 256)},
            np.random.default_rng(start).random(256) + 0.1,
        )
    before = Table.from_state(t.snapshot()).digest()
    snapshot = t.begin_snapshot()
    assert t.inserts % capacity < CHUNK  # the inserts below land in chunk 0, not yet copied
    rng = np.random.default_rng(7)
    for _ in range(3):
        t.insert(
            {"observations": codec.compress(items[:64] + 1), "action": np.arange(64) - 1},
            rng.random(64) + 5,
        )
        keys = rng.integers(0, t.inserts, 3000)
        t.update_priorities(keys, rng.random(3000) + 9)
        snapshot.copy_next()
    state = snapshot.finish()
    assert t.digest() != before
    assert Table.from_state(state).digest() == before
    assert t._snapshot is None  # done: the table's writes no longer copy anything
