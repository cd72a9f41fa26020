"""What every sampler promises beyond its distribution: the dtypes of what it returns, the
errors that name the table and the field, the key scan against a brute-force one, and where
the scans start after a restore."""

from types import SimpleNamespace

import numpy as np
import pytest

from apexrl.common.errors import FailedPrecondition
from apexrl.replay.samplers import FifoSampler, LifoSampler, held_keys, uniform_slots
from apexrl.replay.signature import ColumnSpec
from apexrl.replay.table import Table

SIGNATURE = [ColumnSpec("x", np.dtype(np.int64), ())]


def table(sampler: str, max_times_sampled: int = 0, capacity: int = 8) -> Table:
    return Table(
        "replay-t",
        capacity,
        sampler=sampler,
        remover="fifo",
        max_times_sampled=max_times_sampled,
        signature=SIGNATURE,
        seed=1,
    )


def insert(t: Table, priorities) -> None:
    n = len(priorities)
    t.insert({"x": np.arange(n, dtype=np.int64)}, np.asarray(priorities, np.float64))


@pytest.mark.parametrize(
    "sampler, priorities",
    [
        ("prioritized", [1.0, 2.0, 3.0]),
        ("uniform", [1.0, 1.0, 1.0]),
        ("balanced", [1.0, 0.5, 0.5]),
        ("balanced", [0.5, 0.5, 0.5]),
        ("fifo", [1.0, 1.0, 1.0]),
        ("lifo", [1.0, 1.0, 1.0]),
    ],
)
def test_every_sampler_returns_float64_probabilities_and_float32_weights(sampler, priorities):
    """The wire carries the dtypes a batch has: weights are float32 and probabilities float64,
    for each sampler (and both of balanced's cases: two classes, one)."""
    t = table(sampler)
    insert(t, priorities)
    result = t.sample(2, 0.5)
    assert result.weights.dtype == np.float32 and result.probabilities.dtype == np.float64
    assert result.weights.shape == result.probabilities.shape == (2,)
    assert result.keys.dtype == np.int64


def test_a_table_whose_every_priority_is_0_is_refused_naming_it():
    t = table("prioritized")
    insert(t, [0.0, 0.0])
    with pytest.raises(FailedPrecondition) as caught:
        t.sample(1, 0.5)
    assert caught.value.field == "table"
    assert str(caught.value) == "table: table 'replay-t': every priority is 0"


def test_distinct_batches_need_enough_items_of_positive_priority():
    t = table("prioritized", max_times_sampled=1)
    insert(t, [1.0, 0.0, 0.0, 2.0])
    with pytest.raises(FailedPrecondition) as caught:
        t.sample(3, 0.5)
    assert caught.value.field == "batch_size"
    assert str(caught.value) == (
        "batch_size: table 'replay-t': fewer than batch_size 3 items have a priority > 0"
        " (a batch holds distinct items here)"
    )
    np.testing.assert_array_equal(t.tree.values[:4], np.array([1.0, 0.0, 0.0, 2.0]) ** 0.6)


def brute_force(slot_keys, start, stop, count, newest):
    keys = [k for k in range(start, stop) if slot_keys[k % len(slot_keys)] == k]
    return (keys[::-1] if newest else keys)[:count]


@pytest.mark.parametrize("newest", [False, True])
def test_held_keys_equal_a_brute_force_scan(newest):
    """Holes of thousands of keys (several chunks of the scan each), ranges that start and end
    on a held key or inside a hole, and ranges with nothing to find."""
    rng = np.random.default_rng(5)
    capacity = 5000
    slot_keys = np.full(capacity, -1, np.int64)
    held = np.concatenate([[0, 1, 2], [2600, 2601], rng.choice(np.arange(4000, 9000), 300)])
    slot_keys[held % capacity] = held
    slot_keys[2000] = 7000  # a slot reused by a newer key: 2000 is not held
    for start, stop, count in [
        (0, 9000, 5),
        (0, 9000, 400),
        (0, 2602, 4),
        (2, 2601, 2),
        (3, 2600, 10),
        (4000, 4001, 1),
        (0, 2600, 3),
        (5, 5, 3),
    ]:
        got = held_keys(slot_keys, start, stop, count, newest)
        assert got.dtype == np.int64 and got.ndim == 1
        assert got.tolist() == brute_force(slot_keys, start, stop, count, newest), (start, stop)


def test_held_keys_of_an_empty_range_is_an_empty_int64_array():
    got = held_keys(np.arange(4, dtype=np.int64), 2, 2, 3, newest=False)
    assert got.dtype == np.int64 and got.shape == (0,)


def test_uniform_slots_around_emptied_slots_draw_with_replacement_unless_distinct():
    slot_keys = np.array([-1, 1, -1, 3, 4, -1], np.int64)
    rng = np.random.default_rng(0)
    drawn = uniform_slots(rng, slot_keys, used=6, size=3, batch=30, distinct=False)
    assert set(drawn.tolist()) == {1, 3, 4}
    distinct = uniform_slots(rng, slot_keys, used=6, size=3, batch=3, distinct=True)
    assert sorted(distinct.tolist()) == [1, 3, 4]


def held_table(keys, capacity: int, inserts: int):
    slot_keys = np.full(capacity, -1, np.int64)
    slot_keys[np.asarray(keys) % capacity] = keys
    return SimpleNamespace(slot_keys=slot_keys, capacity=capacity, inserts=inserts)


def test_fifo_after_a_restore_starts_at_the_oldest_key_held():
    sampler = FifoSampler(np.random.default_rng(0))
    sampler.restored(inserts=5, capacity=10)
    keys, _, _ = sampler.select(held_table(range(5), 10, 5), 2, 0.0)
    assert keys.tolist() == [0, 1]
    sampler.restored(inserts=13, capacity=10)  # keys 3 .. 12 held
    keys, _, _ = sampler.select(held_table(range(3, 13), 10, 13), 2, 0.0)
    assert keys.tolist() == [3, 4]  # slots of keys 3, 4


def test_lifo_after_a_restore_starts_at_the_newest_key_held():
    sampler = LifoSampler(np.random.default_rng(0))
    sampler.restored(inserts=13, capacity=10)
    keys, _, _ = sampler.select(held_table(range(3, 13), 10, 13), 3, 0.0)
    assert keys.tolist() == [2, 1, 0]  # slots of keys 12, 11, 10
