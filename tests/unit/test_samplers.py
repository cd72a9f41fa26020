"""Tables as compositions: each sampler and remover against a pure-Python reference, the queue
rate limiter, removal after max_times_sampled, bad compositions, and exact snapshots."""

import random

import numpy as np
import pytest
from scipy import stats

from apexrl.common.errors import FailedPrecondition, InvalidArgument
from apexrl.config import ReplayConfig, replay_table_configs
from apexrl.replay import checkpoint as replay_checkpoint
from apexrl.replay.composition import check_composition
from apexrl.replay.rate_limiters import QueueLimiter, RateLimiter
from apexrl.replay.samplers import held_keys, uniform_slots
from apexrl.replay.server import make_table
from apexrl.replay.signature import ColumnSpec
from apexrl.replay.table import Table

SIGNATURE = [ColumnSpec("x", np.dtype(np.int64), ())]


def items(first: int, n: int) -> dict[str, np.ndarray]:
    """Items whose content is their key."""
    return {"x": np.arange(first, first + n, dtype=np.int64)}


class Reference:
    """The semantics in plain Python: an ordered dict of held key -> times sampled."""

    def __init__(self, capacity: int, sampler: str, remover: str, max_times_sampled: int):
        self.capacity, self.sampler, self.remover = capacity, sampler, remover
        self.k = max_times_sampled
        self.held: dict[int, int] = {}
        self.next_key = 0

    def has_room(self, n: int) -> bool:
        new = range(self.next_key, self.next_key + n)
        return self.remover == "fifo" or not any(k - self.capacity in self.held for k in new)

    def insert(self, n: int) -> None:
        for key in range(self.next_key, self.next_key + n):
            self.held.pop(key - self.capacity, None)  # the slot's previous item, if held
            self.held[key] = 0
        self.next_key += n

    def expected_batch(self, n: int) -> list[int] | None:
        """fifo / lifo: exactly which keys, in order; None for the random samplers."""
        keys = sorted(self.held)
        if self.sampler == "fifo":
            return keys[:n]
        if self.sampler == "lifo":
            return keys[::-1][:n]
        return None

    def sampled(self, keys: list[int]) -> None:
        assert all(k in self.held for k in keys), "sampled an item not held"
        if self.k or self.sampler in ("fifo", "lifo"):
            assert len(set(keys)) == len(keys), "a batch holds distinct items"
        for key in keys:
            self.held[key] += 1
            if self.k and self.held[key] >= self.k:
                del self.held[key]


COMPOSITIONS = [
    ("prioritized", "fifo", 0, "ratio"),
    ("prioritized", "fifo", 2, "ratio"),
    ("uniform", "fifo", 0, "ratio"),
    ("uniform", "fifo", 1, "ratio"),
    ("fifo", "fifo", 0, "ratio"),
    ("fifo", "fifo", 3, "ratio"),
    ("balanced", "fifo", 0, "ratio"),
    ("balanced", "fifo", 1, "ratio"),
    ("lifo", "fifo", 0, "ratio"),
    ("lifo", "fifo", 1, "ratio"),
    ("fifo", "none", 1, "queue"),
    ("fifo", "none", 2, "queue"),
]


def make(capacity, sampler, remover, k, limiter, seed=0, alpha=0.6) -> Table:
    return Table(
        "t",
        capacity,
        sampler=sampler,
        remover=remover,
        max_times_sampled=k,
        alpha=alpha,
        rate_limiter=QueueLimiter() if limiter == "queue" else RateLimiter(),
        signature=SIGNATURE,
        seed=seed,
    )


@pytest.mark.parametrize("composition", COMPOSITIONS, ids=lambda c: "-".join(map(str, c)))
@pytest.mark.parametrize("capacity", [1, 5, 16])
def test_table_follows_the_reference(composition, capacity):
    """Random inserts and samples: the table holds, returns and removes what the reference
    says, in fifo / lifo order, with distinct batches where they must be, and its counters,
    size and stale keys agree."""
    sampler, remover, k, limiter = composition
    table = make(capacity, sampler, remover, k, limiter)
    ref = Reference(capacity, sampler, remover, k)
    rng = random.Random(f"{composition}{capacity}")
    largest_insert = largest_sample = 0
    for _ in range(300):
        if rng.random() < 0.5:
            n = rng.randint(1, capacity)
            if limiter == "queue" and n + largest_sample > capacity + 1:
                with pytest.raises(FailedPrecondition) as e:
                    table.validate_insert(items(0, n), None)
                assert e.value.field == "batch"
                continue
            largest_insert = max(largest_insert, n)
            table.validate_insert(items(ref.next_key, n), None)  # as the server does, first
            assert table.can_insert(n) == ref.has_room(n)
            if not ref.has_room(n):
                before = table.digest()
                with pytest.raises(FailedPrecondition):
                    table.insert(items(ref.next_key, n))
                assert table.digest() == before
                continue
            assert table.insert(items(ref.next_key, n)) == ref.next_key
            ref.insert(n)
        else:
            b = rng.randint(1, capacity)
            if limiter == "queue" and b + largest_insert > capacity + 1:
                with pytest.raises(FailedPrecondition) as e:
                    table.validate_sample(b, 0.0)
                assert e.value.field == "batch_size"
                continue
            largest_sample = max(largest_sample, b)
            table.validate_sample(b, 0.5)  # as the server does, before waiting
            distinct = k > 0 or sampler in ("fifo", "lifo")
            possible = len(ref.held) >= (b if distinct else 1)
            assert table.can_sample(b) == possible
            if not possible:
                continue
            result = table.sample(b, 0.5)
            keys = result.keys.tolist()
            assert result.columns["x"].tolist() == keys  # each item's content is its key
            expected = ref.expected_batch(b)
            if expected is not None:
                assert keys == expected
                np.testing.assert_array_equal(result.probabilities, 1.0)
            if sampler != "prioritized":
                np.testing.assert_array_equal(result.weights, 1.0)
            ref.sampled(keys)
        assert table.size == len(ref.held)
        assert table.removed == table.inserts - len(ref.held)
        held = table.slot_keys[table.slot_keys >= 0]
        assert sorted(held.tolist()) == sorted(ref.held)
        assert table.total_priority == pytest.approx(len(ref.held) * 1.0)  # default priority 1
    if k:
        gone = [key for key in range(ref.next_key) if key not in ref.held][-8:]
        if gone:
            updated, stale = table.update_priorities(np.array(gone), np.ones(len(gone)))
            assert (updated, stale) == (0, len(gone))


def test_fifo_and_lifo_orders_by_hand():
    fifo = make(6, "fifo", "fifo", 0, "ratio")
    fifo.insert(items(0, 4))
    fifo.insert(items(4, 4))  # keys 2 .. 7 held
    assert fifo.sample(3, 0.0).keys.tolist() == [2, 3, 4]
    assert fifo.sample(3, 0.0).keys.tolist() == [2, 3, 4]  # nothing leaves: same again
    lifo = make(6, "lifo", "fifo", 1, "ratio")
    lifo.insert(items(0, 4))
    lifo.insert(items(4, 4))
    assert lifo.sample(2, 0.0).keys.tolist() == [7, 6]
    assert lifo.sample(2, 0.0).keys.tolist() == [5, 4]  # 7, 6 left after one sample
    lifo.insert(items(8, 1))  # overwrites key 2 (slot 2)
    assert lifo.sample(2, 0.0).keys.tolist() == [8, 3]
    assert lifo.size == 0 and lifo.removed == 9


def test_held_keys_scans_past_holes_in_both_directions():
    slot_keys = np.full(1000, -1, np.int64)
    keys = np.array([3, 500, 501, 998])
    slot_keys[keys % 1000] = keys
    assert held_keys(slot_keys, 0, 1000, 3, newest=False).tolist() == [3, 500, 501]
    assert held_keys(slot_keys, 0, 1000, 2, newest=True).tolist() == [998, 501]
    assert held_keys(slot_keys, 4, 1000, 10, newest=False).tolist() == [500, 501, 998]


def test_uniform_with_replacement_matches_1_over_n():
    table = make(10, "uniform", "fifo", 0, "ratio", seed=7)
    table.insert(items(0, 5))
    table.insert(items(5, 10))  # keys 5 .. 14
    counts = np.zeros(15)
    for _ in range(2000):
        result = table.sample(10, 0.4)
        np.add.at(counts, result.keys, 1)
        np.testing.assert_allclose(result.probabilities, 0.1)
    assert counts[:5].sum() == 0
    assert stats.chisquare(counts[5:]).pvalue > 1e-3


def test_uniform_without_replacement_includes_each_item_b_over_n():
    """Batches of 4 distinct items of the 9 held (slot 4 emptied): each item is in a batch
    with probability 4 / 9."""
    slot_keys = np.arange(10, dtype=np.int64)
    slot_keys[4] = -1
    rng = np.random.default_rng(3)
    counts = np.zeros(10)
    for _ in range(3000):
        slots = uniform_slots(rng, slot_keys, 10, 9, 4, distinct=True)
        assert len(set(slots.tolist())) == 4
        np.add.at(counts, slots, 1)
    assert counts[4] == 0
    assert stats.chisquare(np.delete(counts, 4)).pvalue > 1e-3
    full = np.zeros(10)
    for _ in range(3000):
        np.add.at(full, uniform_slots(rng, np.arange(10), 10, 10, 4, distinct=True), 1)
    assert stats.chisquare(full).pvalue > 1e-3


def marked_table() -> Table:
    """1,000 items, 2% of them (every 50th key) marked by priority 1, the rest 0.001."""
    table = make(1000, "balanced", "fifo", 0, "ratio", seed=5)
    priorities = np.where(np.arange(1000) % 50 == 0, 1.001, 0.001)
    table.insert(items(0, 1000), priorities)
    return table


def test_balanced_draws_half_its_items_from_the_two_percent_marked():
    table = marked_table()
    counts = np.zeros(1000)
    for _ in range(300):
        result = table.sample(32, 0.4)
        marked = result.keys % 50 == 0
        np.testing.assert_allclose(result.probabilities, np.where(marked, 0.5 / 20, 0.5 / 980))
        np.add.at(counts, result.keys, 1)
    draws = counts.sum()
    split = [counts[::50].sum(), draws - counts[::50].sum()]
    assert stats.chisquare(split, [draws / 2, draws / 2]).pvalue > 1e-3, split
    assert stats.chisquare(counts[::50]).pvalue > 1e-3  # uniform within the marked class


def test_balanced_takes_one_class_alone_and_fills_a_short_class_from_the_other():
    table = make(10, "balanced", "fifo", 1, "ratio", seed=2)
    table.insert(items(0, 10), np.full(10, 0.5))  # none marked
    np.testing.assert_allclose(table.sample(4, 0.4).probabilities, 1 / 10)  # one class: 1/size
    table = make(10, "balanced", "fifo", 1, "ratio", seed=2)
    table.insert(items(0, 10), np.where(np.arange(10) < 2, 1.0, 0.0))
    result = table.sample(10, 0.4)  # distinct: 2 marked and 8 others, whatever the coins
    assert sorted(result.keys.tolist()) == list(range(10))


def test_prioritized_distribution_and_exact_tree_after_distinct_batches():
    capacity, alpha = 20, 0.8
    p = np.random.default_rng(1).random(capacity) * 3
    p[[2, 9]] = 0.0
    table = make(capacity, "prioritized", "fifo", 0, "ratio", seed=11, alpha=alpha)
    table.insert(items(0, capacity), p)
    counts = np.zeros(capacity)
    for _ in range(1000):
        np.add.at(counts, table.sample(16, 0.0).keys, 1)
    expected = p**alpha / (p**alpha).sum() * counts.sum()
    positive = p > 0
    assert counts[~positive].sum() == 0
    assert stats.chisquare(counts[positive], expected[positive]).pvalue > 1e-3

    distinct = make(capacity, "prioritized", "fifo", 10**9, "ratio", seed=11)
    distinct.insert(items(0, capacity), p)
    tree = distinct.tree.values.copy()
    for _ in range(200):
        result = distinct.sample(18, 0.5)  # all 18 items with priority > 0
        assert sorted(result.keys.tolist()) == np.flatnonzero(positive).tolist()
        mass = p**distinct.alpha
        np.testing.assert_allclose(result.probabilities, mass[result.keys] / mass.sum())
    np.testing.assert_array_equal(distinct.tree.values, tree)
    with pytest.raises(FailedPrecondition) as e:
        distinct.sample(19, 0.5)  # only 18 can be drawn
    assert e.value.field == "batch_size"
    np.testing.assert_array_equal(distinct.tree.values, tree)


def test_items_leave_after_max_times_sampled():
    table = make(4, "fifo", "fifo", 2, "ratio")
    table.insert(items(0, 4), np.array([1.0, 2.0, 3.0, 4.0]))
    table.sample(2, 0.0)  # 0, 1 once
    assert table.size == 4
    table.sample(3, 0.0)  # 0, 1 twice: leave; 2 once
    assert table.size == 2 and table.removed == 2
    np.testing.assert_array_equal(table.slot_keys, [-1, -1, 2, 3])
    np.testing.assert_array_equal(table.priorities, [0, 0, 3, 4])
    assert table.total_priority == pytest.approx(3**0.6 + 4**0.6)
    assert table.update_priorities(np.array([0, 2]), np.array([9.0, 9.0])) == (1, 1)
    assert not table.can_sample(3) and table.can_sample(2)
    with pytest.raises(FailedPrecondition) as e:
        table.sample(3, 0.0)
    assert e.value.field == "batch_size"


# --- the queue rate limiter ---------------------------------------------------------------


def test_queue_blocks_inserts_when_full_and_samples_until_the_batch_is_there():
    queue = Table.queue("q", 4, signature=SIGNATURE)
    assert queue.can_insert(4) and not queue.can_sample(1)
    queue.insert(items(0, 2))
    queue.insert(items(2, 1))
    assert not queue.can_insert(2) and queue.can_insert(1)
    assert queue.can_sample(3) and not queue.can_sample(4)
    queue.insert(items(3, 1))
    assert not queue.can_insert(1)
    before = queue.digest()
    with pytest.raises(FailedPrecondition):  # called without waiting: refused, nothing changes
        queue.insert(items(4, 1))
    assert queue.digest() == before
    assert queue.sample(1, 0.0).keys.tolist() == [0]
    assert queue.can_insert(1) and not queue.can_insert(2)
    queue.insert(items(4, 1))  # key 4 into slot 0
    assert queue.sample(3, 0.0).keys.tolist() == [1, 2, 3]
    assert queue.sample(1, 0.0).keys.tolist() == [4]
    assert queue.size == 0 and not queue.can_sample(1)


def test_queue_refuses_batches_above_capacity_and_pairs_that_could_deadlock():
    queue = Table.queue("q", 4, signature=SIGNATURE)
    with pytest.raises(InvalidArgument) as e:
        queue.validate_sample(5, 0.0)
    assert e.value.field == "batch_size"
    with pytest.raises(InvalidArgument) as e:
        queue.validate_insert(items(0, 5), None)
    assert e.value.field == "batch"
    queue.validate_insert(items(0, 3), None)  # inserts of 3: samples up to 2
    with pytest.raises(FailedPrecondition) as e:
        queue.validate_sample(3, 0.0)
    assert e.value.field == "batch_size" and "'q'" in str(e.value)
    queue.validate_sample(2, 0.0)


@pytest.mark.parametrize("capacity", range(1, 9))
def test_no_queue_batch_sizes_deadlock(capacity):
    """For every allowed pair (insert n, sample B) and every size the queue can hold, one of
    the two can go ahead: they never wait for each other."""
    for n in range(1, capacity + 1):
        for b in range(1, capacity + 2 - n):
            for size in range(capacity + 1):
                queue = Table.queue("q", capacity, signature=SIGNATURE)
                queue.validate_insert(items(0, n), None)
                queue.validate_sample(b, 0.0)
                for key in range(size):
                    queue.insert(items(key, 1))
                assert queue.can_insert(n) or queue.can_sample(b), (n, b, size)


# --- bad compositions -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "sampler, remover, k, limiter, words",
    [
        ("prioritized", "none", 0, "queue", ["'bad'", "max_times_sampled 0"]),
        ("fifo", "none", 0, "queue", ["'bad'", "max_times_sampled 0"]),
        ("prioritized", "none", 1, "queue", ["'bad'", "sampler"]),
        ("lifo", "none", 1, "queue", ["'bad'", "sampler"]),
        ("fifo", "none", 1, "ratio", ["'bad'", "rate_limiter"]),
        ("fifo", "fifo", 1, "queue", ["'bad'", "rate_limiter 'queue'"]),
        ("random", "fifo", 0, "ratio", ["'bad'", "sampler 'random'"]),
        ("fifo", "lru", 0, "ratio", ["'bad'", "remover 'lru'"]),
        ("fifo", "fifo", -1, "ratio", ["'bad'", "max_times_sampled"]),
        ("fifo", "fifo", 0, "token", ["'bad'", "rate_limiter 'token'"]),
    ],
)
def test_bad_compositions_are_refused_naming_the_table(sampler, remover, k, limiter, words):
    with pytest.raises(ValueError) as e:
        check_composition("bad", sampler, remover, k, limiter)
    assert all(w in str(e.value) for w in words), str(e.value)


def test_config_tables_refused_naming_table_and_setting():
    with pytest.raises(ValueError, match="'a' is declared twice"):
        replay_table_configs([{"name": "a", "capacity": 4}, {"name": "a", "capacity": 8}])
    with pytest.raises(ValueError, match="table 'a' has unknown key 'samplr'"):
        replay_table_configs([{"name": "a", "samplr": "fifo"}])
    with pytest.raises(ValueError, match="table 'q': min_size_to_sample applies"):
        replay_table_configs([{"name": "q", "rate_limiter": "queue", "min_size_to_sample": 1}])
    with pytest.raises(ValueError, match="needs a name"):
        replay_table_configs([{"capacity": 4}])
    with pytest.raises(ValueError, match="table 'p'.*max_times_sampled"):
        ReplayConfig(tables=[{"name": "p", "capacity": 4, "max_times_sampled": "x"}])
    (queue,) = replay_table_configs(
        [
            {
                "name": "q",
                "capacity": 8,
                "sampler": "prioritized",
                "remover": "none",
                "max_times_sampled": 0,
                "rate_limiter": "queue",
            }
        ]  # fmt: skip
    )
    with pytest.raises(ValueError, match="table 'q': remover 'none' with max_times_sampled 0"):
        make_table(queue, 64, seed=None)
    (small,) = replay_table_configs([{"name": "s", "capacity": 8}])  # min size 1000 > 8
    with pytest.raises(ValueError, match="table 's': capacity 8 < min_size_to_sample"):
        make_table(small, 64, seed=None)


def test_flat_settings_make_todays_table():
    (settings,) = ReplayConfig(
        table="t", capacity=99, alpha=0.3, min_size_to_sample=1
    ).table_configs()
    table = make_table(settings, 64, seed=None)
    assert (table.name, table.capacity, table.alpha, table.sampler, table.remover) == (
        "t", 99, 0.3, "prioritized", "fifo",
    )  # fmt: skip
    assert table.max_times_sampled == 0 and table.rate_limiter.kind == "ratio"


# --- checkpoints ----------------------------------------------------------------------------


def churned(composition, seed=0) -> Table:
    """A table after inserts and samples that removed some items."""
    table = make(16, *composition, seed=seed)
    rng = random.Random(seed)
    for _ in range(40):
        if rng.random() < 0.5:
            n = rng.randint(1, 5)
            if table.can_insert(n):
                table.insert(items(table.inserts, n), np.full(n, rng.random() + 0.1))
        elif table.can_sample(3):
            table.sample(3, 0.0)
    return table


@pytest.mark.parametrize("composition", COMPOSITIONS, ids=lambda c: "-".join(map(str, c)))
def test_states_restore_exactly(composition, tmp_path):
    tables = [churned(composition, seed) for seed in range(3)]
    for i, table in enumerate(tables):
        table.name = f"t{i}"
    replay_checkpoint.write_checkpoint(tmp_path, [t.snapshot() for t in tables])
    _, states = replay_checkpoint.load_newest(tmp_path)
    for table, state in zip(tables, states, strict=True):
        copy = Table.from_state(state)
        assert copy.digest() == table.digest()
        assert (copy.size, copy.removed) == (table.size, table.removed)
        if table.times_sampled is not None:
            np.testing.assert_array_equal(copy.times_sampled, table.times_sampled)
        # and it goes on the same way: same items next (fifo / lifo are deterministic)
        if table.sampler in ("fifo", "lifo") and table.can_sample(1):
            assert copy.sample(1, 0.0).keys == table.sample(1, 0.0).keys


def test_snapshot_is_as_of_its_start_while_samples_remove_items():
    table = make(40_000, "fifo", "fifo", 1, "ratio")
    table.insert(items(0, 40_000))
    expected = Table.from_state(table.snapshot()).digest()
    snapshot = table.begin_snapshot()
    snapshot.copy_next()
    table.sample(30_000, 0.0)  # removes items in chunks not copied yet
    state = snapshot.finish()
    assert Table.from_state(state).digest() == expected
    assert Table.from_state(state).size == 40_000 and table.size == 10_000


def test_a_state_with_other_settings_is_refused():
    state = churned(("fifo", "none", 1, "queue")).snapshot()
    other = Table.queue("t", 16, max_times_sampled=2, signature=SIGNATURE)
    with pytest.raises(ValueError, match="max_times_sampled"):
        other.restore(state)
    with pytest.raises(ValueError, match="sampler"):
        make(16, "lifo", "fifo", 1, "ratio").restore(
            churned(("fifo", "fifo", 1, "ratio")).snapshot()
        )
    broken = churned(("fifo", "fifo", 3, "ratio")).snapshot()
    broken.times_sampled[broken.slot_keys >= 0] = 3
    with pytest.raises(ValueError, match="times_sampled"):
        Table.from_state(broken)
