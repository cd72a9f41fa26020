import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from apexrl.common.errors import FailedPrecondition, InvalidArgument
from apexrl.replay.priorities import MAX_UPDATE_BATCH
from apexrl.replay.rate_limiters import RateLimiter
from apexrl.replay.signature import ColumnSpec, parse_signature
from apexrl.replay.table import Table

SIGNATURE = [
    ColumnSpec("obs", np.dtype(np.uint8), (2, 3)),
    ColumnSpec("reward", np.dtype(np.float32), ()),
]


def batch(n: int, start: int = 0) -> dict[str, np.ndarray]:
    """Items whose content identifies them: obs is filled with (key % 256)."""
    keys = np.arange(start, start + n)
    return {
        "obs": np.broadcast_to((keys % 256).astype(np.uint8)[:, None, None], (n, 2, 3)).copy(),
        "reward": keys.astype(np.float32),
    }


def filled(capacity=8, n=None, **kwargs) -> Table:
    table = Table("t", capacity, signature=SIGNATURE, seed=0, **kwargs)
    n = capacity if n is None else n
    if n:
        table.insert(batch(n), np.arange(1, n + 1, dtype=np.float64))
    return table


# --- insert and FIFO -------------------------------------------------------------------


def test_fifo_eviction_with_wrap_around():
    table = Table("t", 5, signature=SIGNATURE)
    assert table.insert(batch(3)) == 0
    assert table.insert(batch(3, 3)) == 3  # slots 3, 4, then wraps to 0
    np.testing.assert_array_equal(table.slot_keys, [5, 1, 2, 3, 4])
    assert table.insert(batch(5, 6), np.full(5, 2.0)) == 6  # full batch from slot 1
    np.testing.assert_array_equal(table.slot_keys, [10, 6, 7, 8, 9])
    np.testing.assert_array_equal(table.columns["reward"], [10, 6, 7, 8, 9])
    np.testing.assert_array_equal(table.columns["obs"][:, 0, 0], [10, 6, 7, 8, 9])
    assert table.size == 5 and table.inserts == 11
    assert table.total_priority == pytest.approx(5 * 2.0**0.6)


def test_first_insert_fixes_signature_and_default_priority():
    table = Table("t", 4)
    assert table.signature is None
    table.insert({"x": np.zeros((2, 3), np.int16)})
    assert table.signature == (ColumnSpec("x", np.dtype("<i2"), (3,)),)
    np.testing.assert_array_equal(table.priorities, [1, 1, 0, 0])  # max_priority, 1.0
    table.insert({"x": np.zeros((1, 3), np.int16)}, np.array([7.0]))
    table.insert({"x": np.zeros((1, 3), np.int16)})
    assert table.priorities[3] == 7.0 and table.max_priority == 7.0
    with pytest.raises(InvalidArgument) as e:
        table.insert({"x": np.zeros((1, 4), np.int16)})
    assert e.value.field == 'batch.columns["x"]'


def test_storage_is_lazy_zeros():
    table = Table("t", 1000, signature=SIGNATURE)
    assert table.columns["obs"].shape == (1000, 2, 3)
    assert not table.columns["obs"].any()


# --- sampling ----------------------------------------------------------------------------


def test_sampling_frequencies_match_priorities():
    capacity, alpha = 40, 0.7
    table = Table("t", capacity, alpha=alpha, signature=SIGNATURE, seed=1234)
    priorities = np.random.default_rng(5).random(capacity) * 3
    priorities[[3, 17]] = 0.0  # never sampled
    table.insert(batch(capacity), priorities)
    expected = priorities**alpha / (priorities**alpha).sum()
    counts = np.zeros(capacity)
    draws = 0
    for _ in range(500):
        r = table.sample(37, beta=0.5)
        np.testing.assert_allclose(r.probabilities, expected[r.keys], rtol=1e-12)
        np.testing.assert_array_equal(r.columns["reward"], r.keys.astype(np.float32))
        counts += np.bincount(r.keys, minlength=capacity)
        draws += 37
    assert counts[3] == counts[17] == 0
    live = expected > 0
    _, p = stats.chisquare(counts[live], expected[live] * draws)
    assert p > 1e-3
    assert table.samples == draws


def test_importance_weights_by_hand():
    table = filled(capacity=10, alpha=0.5)
    beta = 0.4
    r = table.sample(8, beta)
    p = np.arange(1, 11, dtype=np.float64) ** 0.5
    prob = p[r.keys] / p.sum()
    w = (10 * prob) ** -beta
    w /= w.max()
    assert r.weights.dtype == np.float32 and r.probabilities.dtype == np.float64
    assert r.keys.dtype == np.int64 and r.table_size == 10
    np.testing.assert_allclose(r.weights, w, rtol=1e-6)
    assert r.weights.max() == 1.0
    np.testing.assert_array_equal(table.sample(8, 0.0).weights, np.ones(8, np.float32))


def test_alpha_zero_is_uniform_even_for_zero_priority():
    table = Table("t", 6, alpha=0.0, signature=SIGNATURE, seed=0)
    table.insert(batch(4), np.array([0.0, 1.0, 100.0, 0.0]))
    r = table.sample(4, 1.0)
    np.testing.assert_array_equal(r.probabilities, np.full(4, 0.25))
    np.testing.assert_array_equal(np.sort(r.keys), [0, 1, 2, 3])  # stratified, uniform
    assert table.total_priority == 4.0  # empty slots stay 0


def test_sample_preconditions():
    table = Table("t", 4, signature=SIGNATURE)
    with pytest.raises(FailedPrecondition):
        table.sample(1, 0.5)
    table.insert(batch(2), np.zeros(2))
    with pytest.raises(FailedPrecondition):
        table.sample(1, 0.5)
    assert table.samples == 0


# --- priorities --------------------------------------------------------------------------


def test_stale_keys_ignored_and_counted():
    table = filled(capacity=4)  # keys 0..3
    table.insert(batch(2, 4))  # keys 4, 5 overwrite 0, 1
    before = table.priorities.copy()
    keys = np.array([0, 1, 2, 5, 99], np.int64)  # 0, 1 overwritten; 99 never written
    assert table.update_priorities(keys, np.full(5, 9.0)) == (2, 3)
    assert table.priority_updates == 2 and table.stale_priority_updates == 3
    expected = before.copy()
    expected[[2, 1]] = 9.0  # key 2 -> slot 2, key 5 -> slot 1
    np.testing.assert_array_equal(table.priorities, expected)
    assert table.max_priority == 9.0
    huge = np.array([2**64 - 1, 2**63, 3], np.uint64)
    assert table.update_priorities(huge, np.array([1.0, 1.0, 0.5], np.float32)) == (1, 2)
    assert table.priorities[3] == 0.5


def test_duplicate_keys_last_wins():
    table = filled(capacity=4, alpha=1.0)
    assert table.update_priorities(np.array([1, 2, 1]), np.array([5.0, 6.0, 7.0])) == (3, 0)
    assert table.priorities[1] == 7.0
    assert table.total_priority == 1 + 7 + 6 + 4


def test_staged_updates_count_at_once_and_land_before_anything_reads():
    """stage_priorities (the server's half of update_priorities) checks and counts now and
    writes later; whatever reads or changes the table first sees every staged update, in
    order, as if update_priorities had run."""
    staged, direct = filled(capacity=4, alpha=1.0), filled(capacity=4, alpha=1.0)
    calls = [([1, 2], [5.0, 6.0]), ([1, 9], [7.0, 1.0]), ([3], [0.5])]
    for keys, priorities in calls:
        counts = staged.stage_priorities(np.array(keys), np.array(priorities))
        assert counts == direct.update_priorities(np.array(keys), np.array(priorities))
    assert (staged.priority_updates, staged.stale_priority_updates) == (4, 1)
    assert staged.priorities[1] == 2.0  # not written yet
    assert staged.digest() == direct.digest()  # the digest applies them: the last one wins

    # An insert applies them before it overwrites: key 0's new priority goes with it, not
    # onto the item that takes its slot; the new item gets the max priority including them.
    staged, direct = filled(capacity=4), filled(capacity=4)
    staged.stage_priorities(np.array([0, 1]), np.array([9.0, 3.0]))
    direct.update_priorities(np.array([0, 1]), np.array([9.0, 3.0]))
    staged.insert(batch(1, 4))
    direct.insert(batch(1, 4))
    assert staged.priorities[0] == 9.0 and staged.max_priority == 9.0
    assert staged.digest() == direct.digest()

    # A sample applies them first: every sample lands on the one item left with priority.
    table = filled(capacity=4)
    table.stage_priorities(np.arange(4), np.array([0.0, 0.0, 2.0, 0.0]))
    assert {k for _ in range(16) for k in table.sample(4, beta=0.4).keys} == {2}
    # A snapshot includes them.
    table.stage_priorities(np.array([3]), np.array([8.0]))
    assert table.snapshot().priorities[3] == 8.0


# --- bad input: right error, right field, nothing changed ---------------------------------


def _insert(columns=None, priorities=None, **changes):
    def call(table):
        cols = batch(2) if columns is None else columns
        cols = {**cols, **changes}
        return table.insert({k: v for k, v in cols.items() if v is not None}, priorities)

    return call


OBS = 'batch.columns["obs"]'
BAD = [
    (_insert(obs=None), InvalidArgument, OBS),
    (_insert(extra=np.zeros(2)), InvalidArgument, 'batch.columns["extra"]'),
    (_insert(obs=np.zeros((2, 2, 3), np.int8)), InvalidArgument, OBS),
    (_insert(obs=np.zeros((2, 3, 2), np.uint8)), InvalidArgument, OBS),
    (_insert(obs=np.zeros((), np.uint8)), InvalidArgument, OBS),
    (_insert(obs=[[0]]), InvalidArgument, OBS),
    (_insert(reward=np.zeros(3, np.float32)), InvalidArgument, 'batch.columns["reward"]'),
    (_insert(columns={}), InvalidArgument, "batch.columns"),
    (_insert(batch(0)), InvalidArgument, "batch"),
    (_insert(batch(9)), InvalidArgument, "batch"),  # > capacity 8
    (_insert(priorities=np.ones(2, np.float16)), InvalidArgument, "priorities"),
    (_insert(priorities=np.ones(2, np.int64)), InvalidArgument, "priorities"),
    (_insert(priorities=np.ones(3)), InvalidArgument, "priorities"),
    (_insert(priorities=np.ones((2, 1))), InvalidArgument, "priorities"),
    (_insert(priorities=np.array([1.0, np.nan])), InvalidArgument, "priorities"),
    (_insert(priorities=np.array([np.inf, 1.0])), InvalidArgument, "priorities"),
    (_insert(priorities=np.array([1.0, -1e-9])), InvalidArgument, "priorities"),
    (_insert(priorities=[1.0, 1.0]), InvalidArgument, "priorities"),
    (lambda t: t.sample(0, 0.5), InvalidArgument, "batch_size"),
    (lambda t: t.sample(9, 0.5), InvalidArgument, "batch_size"),
    (lambda t: t.sample(True, 0.5), InvalidArgument, "batch_size"),
    (lambda t: t.sample(2.0, 0.5), InvalidArgument, "batch_size"),
    (lambda t: t.sample(2, -0.1), InvalidArgument, "beta"),
    (lambda t: t.sample(2, 1.5), InvalidArgument, "beta"),
    (lambda t: t.sample(2, math.nan), InvalidArgument, "beta"),
    (lambda t: t.update_priorities(np.array([1], np.int32), np.ones(1)), InvalidArgument, "keys"),
    (lambda t: t.update_priorities(np.array([1, -1]), np.ones(2)), InvalidArgument, "keys"),
    (lambda t: t.update_priorities(np.array([[1]]), np.ones(1)), InvalidArgument, "keys"),
    (lambda t: t.update_priorities(np.array([], np.int64), np.ones(0)), InvalidArgument, "keys"),
    (
        lambda t: t.update_priorities(np.zeros(MAX_UPDATE_BATCH + 1, np.int64), np.ones(1)),
        InvalidArgument,
        "keys",
    ),
    (lambda t: t.update_priorities(np.array([1, 2]), np.ones(3)), InvalidArgument, "priorities"),
    (
        lambda t: t.update_priorities(np.array([1, 2]), np.array([1.0, np.nan])),
        InvalidArgument,
        "priorities",
    ),
    (
        lambda t: t.update_priorities(np.array([1, 2]), np.array([1.0, -2.0])),
        InvalidArgument,
        "priorities",
    ),
]


@pytest.mark.parametrize(("call", "error", "field"), BAD)
def test_bad_input_changes_nothing(call, error, field):
    table = filled(capacity=8, n=5)
    table.update_priorities(np.array([1]), np.array([3.0]))
    digest = table.digest()
    with pytest.raises(error) as e:
        call(table)
    assert type(e.value) is error
    assert e.value.field == field
    assert str(e.value).startswith(field)
    assert table.digest() == digest


def test_max_batch_size_limits_insert_and_sample():
    table = filled(capacity=8, n=3, max_batch_size=3)
    digest = table.digest()
    with pytest.raises(InvalidArgument, match="batch"):
        table.insert(batch(4))
    with pytest.raises(InvalidArgument, match="batch_size"):
        table.sample(4, 0.5)
    assert table.digest() == digest


@pytest.mark.parametrize(
    ("columns", "field"),
    [
        ({}, "batch.columns"),
        ({"a": np.zeros(2), "b": np.zeros(3)}, 'batch.columns["b"]'),
        ({"a": np.zeros(0)}, "batch"),
        ({"a": np.zeros(2, np.complex64)}, 'batch.columns["a"]'),
        ({"a": np.zeros(2, object)}, 'batch.columns["a"]'),
        ({"": np.zeros(2)}, 'batch.columns[""]'),
    ],
)
def test_bad_first_insert_changes_nothing(columns, field):
    table = Table("t", 4)
    digest = table.digest()
    with pytest.raises(InvalidArgument) as e:
        table.insert(columns)
    assert e.value.field == field
    assert table.digest() == digest and table.signature is None


def test_constructor_validation():
    with pytest.raises(ValueError, match="capacity"):
        Table("t", 0)
    with pytest.raises(ValueError, match="alpha"):
        Table("t", 4, alpha=-0.1)
    with pytest.raises(ValueError, match="alpha"):
        Table("t", 4, alpha=math.inf)
    with pytest.raises(ValueError, match="min_size_to_sample"):
        Table("t", 4, rate_limiter=RateLimiter(min_size_to_sample=5))
    with pytest.raises(ValueError, match="duplicate"):
        Table("t", 4, signature=[SIGNATURE[0], SIGNATURE[0]])
    with pytest.raises(ValueError, match="dtype"):
        ColumnSpec("x", np.dtype(object), ())


# --- rate limiter ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"min_size_to_sample": 0}, "min_size_to_sample"),
        ({"samples_per_insert": -1.0}, "samples_per_insert"),
        ({"samples_per_insert": math.nan}, "samples_per_insert"),
        ({"samples_per_insert": math.inf, "error_buffer": 1.0}, "samples_per_insert"),
        ({"samples_per_insert": 1.0}, "error_buffer"),
        ({"samples_per_insert": 1.0, "error_buffer": -1.0}, "error_buffer"),
    ],
)
def test_rate_limiter_validation(kwargs, field):
    with pytest.raises(ValueError, match=field):
        RateLimiter(**kwargs)


def test_rate_limiter_window():
    # diff = 2 * inserts - samples must stay in (2 * 10 - 5, 2 * 10 + 5) = (15, 25).
    rl = RateLimiter(min_size_to_sample=10, samples_per_insert=2.0, error_buffer=5.0)
    assert not rl.can_sample(inserts=9, samples=0, size=9)  # below min size
    assert rl.can_sample(inserts=10, samples=4, size=10)  # diff 16 > 15
    assert not rl.can_sample(inserts=10, samples=5, size=10)  # diff 15
    assert rl.can_insert(inserts=12, samples=0)  # diff 24 < 25
    assert not rl.can_insert(inserts=13, samples=0)  # diff 26
    free = RateLimiter(min_size_to_sample=3)
    assert free.can_insert(10**9, 0) and free.can_sample(0, 10**9, 3)
    assert not free.can_sample(5, 0, 2)


def test_table_uses_its_counters_for_the_limiter():
    table = Table("t", 100, signature=SIGNATURE, seed=0, rate_limiter=RateLimiter(4, 1.0, 2.0))
    assert table.can_insert() and not table.can_sample()
    table.insert(batch(6))  # diff 6 >= 4 + 2: inserts wait, samples may go
    assert not table.can_insert() and table.can_sample()
    table.sample(5, 0.0)  # diff 1 <= 4 - 2
    assert table.can_insert() and not table.can_sample()


@settings(max_examples=200, deadline=None)
@given(
    min_size=st.integers(1, 50),
    spi=st.floats(0.0, 64.0),
    error_buffer=st.floats(1e-3, 100.0),
    extra_capacity=st.integers(0, 100),
    insert_sizes=st.lists(st.integers(1, 1000), min_size=1, max_size=4),
    sample_sizes=st.lists(st.integers(1, 1000), min_size=1, max_size=4),
    seed=st.integers(0, 2**32 - 1),
)
def test_no_batch_size_deadlocks(
    min_size, spi, error_buffer, extra_capacity, insert_sizes, sample_sizes, seed
):
    rl = RateLimiter(min_size, spi, error_buffer)
    capacity = min_size + extra_capacity
    rng = np.random.default_rng(seed)
    inserts = samples = 0
    for _ in range(300):
        ok_insert = rl.can_insert(inserts, samples)
        ok_sample = rl.can_sample(inserts, samples, min(inserts, capacity))
        assert ok_insert or ok_sample, (inserts, samples)
        if ok_insert and (not ok_sample or rng.random() < 0.5):
            inserts += int(rng.choice(insert_sizes))
        else:
            samples += int(rng.choice(sample_sizes))


# --- digest, snapshot, restore -----------------------------------------------------------


def busy_table() -> Table:
    table = Table("t", 8, alpha=0.7, signature=SIGNATURE, seed=3)
    table.insert(batch(5))
    table.insert(batch(6, 5), np.linspace(0, 2, 6))
    table.sample(4, 0.5)
    table.update_priorities(np.array([0, 9, 10]), np.array([1.5, 0.25, 3.0]))
    return table


def test_snapshot_restore_round_trip():
    table = busy_table()
    state = table.snapshot()
    copy = Table.from_state(state)
    assert copy.digest() == table.digest()
    np.testing.assert_array_equal(copy.tree.values, table.tree.values)
    assert copy.total_priority == table.total_priority
    # The snapshot is a copy: the table moves on, the state does not.
    table.insert(batch(3, 11))
    assert copy.digest() != table.digest()
    assert Table.from_state(state).digest() == copy.digest()
    # Restoring into a configured table with more items clears the surplus rows.
    table.insert(batch(8, 14))
    table.restore(state)
    assert table.digest() == copy.digest()
    small = Table("t", 8, alpha=0.7, signature=SIGNATURE)
    small.insert(batch(2))
    small.restore(Table("t", 8, alpha=0.7).snapshot())  # empty state, signature kept
    assert small.size == 0 and not small.columns["obs"].any()


def test_digest_sees_every_change():
    a, b = busy_table(), busy_table()
    assert a.digest() == b.digest()
    b.columns["obs"][2, 1, 1] += 1
    assert a.digest() != b.digest()
    c = busy_table()
    c.samples += 1
    assert a.digest() != c.digest()


def test_restore_rejects_mismatched_state():
    state = busy_table().snapshot()
    for table, field in [
        (Table("t", 9, alpha=0.7, signature=SIGNATURE), "capacity"),
        (Table("t", 8, alpha=0.6, signature=SIGNATURE), "alpha"),
        (Table("t", 8, alpha=0.7, signature=SIGNATURE[:1]), "signature"),
        (Table("u", 8, alpha=0.7, signature=SIGNATURE), "name"),
    ]:
        digest = table.digest()
        with pytest.raises(ValueError, match=field):
            table.restore(state)
        assert table.digest() == digest
    state.slot_keys[0] = 123
    with pytest.raises(ValueError, match="slot_keys"):
        Table("t", 8, alpha=0.7).restore(state)


def test_bounded_column_refuses_values_outside_its_range_naming_it():
    """A signature can bound a column (an env's action range): a misconfigured actor's
    out-of-range or NaN actions are refused, naming the column, and nothing changes."""
    spec = parse_signature("obs:float32:3,action:float32:1:-2..2")
    assert spec[1] == ColumnSpec("action", np.dtype("float32"), (1,), (-2.0, 2.0))
    assert ColumnSpec.from_json(spec[1].to_json()) == spec[1]  # as the checkpoint keeps it
    table = Table("t", 10, signature=spec)
    obs = np.zeros((3, 3), np.float32)
    table.insert({"obs": obs, "action": np.array([[-2.0], [0.5], [2.0]], np.float32)})
    digest = table.digest()
    for bad in (2.5, -2.01, np.nan):
        actions = np.array([[0.0], [bad], [1.0]], np.float32)
        with pytest.raises(InvalidArgument) as caught:
            table.insert({"obs": obs, "action": actions})
        assert str(caught.value).startswith('batch.columns["action"]: values must lie in [-2, 2]')
    assert table.digest() == digest
    with pytest.raises(ValueError, match="low..high"):
        parse_signature("action:float32:1:-2")
    with pytest.raises(ValueError, match="empty"):
        parse_signature("action:float32:1:2..-2")
