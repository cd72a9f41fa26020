"""The priority-update path at the sizes the learner sends: the sum tree's sparse and dense
levels, last_occurrence's packed sort, the table's update against a one-key-at-a-time
reference, and the learner's pipelined sender (every update kept, stops on stop)."""

import queue
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apexrl.learner.write_back import write_priorities
from apexrl.replay.signature import ColumnSpec
from apexrl.replay.sumtree import SumTree, last_occurrence
from apexrl.replay.table import Table

# --- last_occurrence ---------------------------------------------------------------------


def stable_reference(indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(indices, kind="stable")
    ordered = indices[order]
    last = np.append(ordered[1:] != ordered[:-1], True)
    return ordered[last], order[last]


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 3000), st.sampled_from([2, 50, 10**6, 2**40]), st.integers(0, 2**32 - 1))
def test_last_occurrence_matches_stable_sort(n, high, seed):
    """Short input takes the stable argsort, long input the packed sort: the same answer."""
    indices = np.random.default_rng(seed).integers(0, high, n)
    for got, want in zip(last_occurrence(indices), stable_reference(indices), strict=True):
        np.testing.assert_array_equal(got, want)
        assert got.dtype == np.int64


@pytest.mark.parametrize(
    "indices",
    [
        np.array([2**62, 5, 2**62] * 40),  # too large to pack: the stable sort
        np.array([-3, 7, -3] * 40),  # negative: the stable sort
        np.arange(100, dtype=np.int32)[::-1],  # not int64: the stable sort
    ],
)
def test_last_occurrence_outside_the_packed_range(indices):
    for got, want in zip(last_occurrence(indices), stable_reference(indices), strict=True):
        np.testing.assert_array_equal(got, want)


# --- sum tree: sparse levels (wide trees) and dense levels --------------------------------


def check_consistent(tree: SumTree) -> None:
    nodes, leaves = tree._nodes, tree._leaves
    parents = np.arange(1, leaves)
    np.testing.assert_array_equal(nodes[parents], nodes[2 * parents] + nodes[2 * parents + 1])
    assert (nodes[leaves + tree.capacity :] == 0).all()


@pytest.mark.parametrize("capacity", [1, 2, 3000, 70_000, 300_001])
@pytest.mark.parametrize("n", [1, 512, 8192])
def test_set_equals_rebuilding_the_tree(capacity, n):
    """Whatever mix of node-by-node and whole-level recomputation set() uses, the tree is
    bit for bit the one reset() builds from the same leaves."""
    rng = np.random.default_rng(capacity + n)
    tree, ref = SumTree(capacity), np.zeros(capacity)
    tree.reset(ref)
    for _ in range(3):
        indices = rng.integers(0, capacity, n)
        values = rng.random(n) * (rng.random(n) > 0.1)
        tree.set(indices, values)
        for i, v in zip(indices, values, strict=True):
            ref[i] = v
        rebuilt = SumTree(capacity)
        rebuilt.reset(ref)
        np.testing.assert_array_equal(tree._nodes, rebuilt._nodes)
        check_consistent(tree)


def test_distinct_set_equals_plain_set():
    rng = np.random.default_rng(3)
    a, b = SumTree(100_000), SumTree(100_000)
    indices = np.unique(rng.integers(0, 100_000, 2000))
    values = rng.random(len(indices))
    a.set(indices, values)
    b.set(rng.permutation(indices), np.zeros(len(indices)), distinct=True)
    b.set(indices, values, distinct=True)
    np.testing.assert_array_equal(a._nodes, b._nodes)


# --- the table's update against a one-key-at-a-time reference -----------------------------


def test_update_priorities_matches_one_key_at_a_time():
    """Large updates with stale, never-written, huge and repeated keys: each key, in order,
    either sets its item's priority (the last one wins) or counts as stale."""
    capacity, alpha = 50_000, 0.6
    rng = np.random.default_rng(4)
    table = Table("t", capacity, alpha=alpha, signature=[ColumnSpec("x", np.dtype("f4"), ())])
    table.insert({"x": np.zeros(capacity, np.float32)})
    table.insert({"x": np.zeros(capacity // 2, np.float32)})  # keys < capacity / 2 are stale
    for dtype in (np.int64, np.uint64):
        n = 8192
        keys = rng.integers(0, table.inserts + 100, n).astype(dtype)
        keys[: n // 4] = keys[n // 4 : n // 2]  # plenty of repeats
        if dtype == np.uint64:
            keys[-3:] = [2**64 - 1, 2**63, 2**48]
        priorities = (rng.random(n) * 5).astype(np.float32)
        expected, live = table.priorities.copy(), 0
        for k, p in zip(keys.tolist(), priorities.astype(np.float64).tolist(), strict=True):
            if k < table.inserts and table.slot_keys[k % capacity] == k:
                expected[k % capacity] = p
                live += 1
        counters = table.priority_updates, table.stale_priority_updates
        assert table.update_priorities(keys, priorities) == (live, n - live)
        assert (table.priority_updates, table.stale_priority_updates) == (
            counters[0] + live,
            counters[1] + n - live,
        )
        np.testing.assert_array_equal(table.priorities, expected)
        np.testing.assert_array_equal(table.tree.values, expected**alpha)
        check_consistent(table.tree)


# --- the learner's sender ------------------------------------------------------------------


class RecordingReplay:
    """Records every call; can hold calls (to see how many are in flight) or fail them."""

    def __init__(self, hold: float = 0.0, fail: bool = False):
        self.hold, self.fail = hold, fail
        self.calls: list[tuple[np.ndarray, np.ndarray]] = []
        self.in_flight = self.most_in_flight = 0
        self.lock = threading.Lock()

    def update_priorities(self, keys, priorities):
        with self.lock:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            time.sleep(self.hold)
            if self.fail:
                raise ConnectionError("replay is gone")
            with self.lock:
                self.calls.append((keys, priorities))
        finally:
            with self.lock:
                self.in_flight -= 1


def run_writer(replay, updates: queue.Queue, stop=None, senders=4, coalesce=16) -> list[int]:
    sent: list[int] = []
    writer = threading.Thread(
        target=write_priorities,
        args=(replay, updates, stop or threading.Event(), sent.append),
        kwargs={"coalesce": coalesce, "senders": senders},
    )
    writer.start()
    writer.join(30)
    assert not writer.is_alive()
    return sent


def test_every_update_arrives_once_coalesced_and_pipelined():
    replay = RecordingReplay(hold=0.01)
    updates: queue.Queue = queue.Queue()
    n_updates = 200
    for i in range(n_updates):
        updates.put((np.arange(i * 512, (i + 1) * 512), np.full(512, float(i), np.float32)))
    updates.put(None)
    sent = run_writer(replay, updates)
    keys = np.concatenate([k for k, _ in replay.calls])
    np.testing.assert_array_equal(np.sort(keys), np.arange(n_updates * 512))  # each once
    for k, p in replay.calls:
        assert len(k) <= 16 * 512
        np.testing.assert_array_equal(p, k // 512)  # each key with its own update's priority
    assert sum(sent) == n_updates * 512
    assert len(replay.calls) < n_updates  # coalesced
    assert 1 < replay.most_in_flight <= 4  # pipelined, bounded


def test_one_sender_keeps_the_order_within_and_across_calls():
    replay = RecordingReplay()
    updates: queue.Queue = queue.Queue()
    for i in range(40):
        updates.put((np.array([1000, i]), np.array([float(i), 1.0])))
    updates.put(None)
    run_writer(replay, updates, senders=1)
    keys = np.concatenate([k for k, _ in replay.calls])
    values = np.concatenate([p for _, p in replay.calls])
    np.testing.assert_array_equal(values[keys == 1000], np.arange(40))
    assert replay.most_in_flight == 1


def test_failures_are_logged_and_the_writer_carries_on(caplog):
    replay = RecordingReplay(fail=True)
    updates: queue.Queue = queue.Queue()
    for _ in range(3):
        updates.put((np.arange(4), np.ones(4)))
    updates.put(None)
    assert run_writer(replay, updates, senders=1, coalesce=1) == []
    assert caplog.text.count("priority update of 4 keys failed") == 3


def test_stop_ends_the_senders_promptly_without_noise(caplog):
    """Once stop is set (the learner closed the replay client), failing calls end their
    senders quietly; the writer returns without waiting for anything more."""
    replay = RecordingReplay(hold=0.05, fail=True)
    updates: queue.Queue = queue.Queue()
    for _ in range(8):
        updates.put((np.arange(4), np.ones(4)))
    stop = threading.Event()
    stop.set()
    started = time.monotonic()
    assert run_writer(replay, updates, stop=stop, senders=4, coalesce=1) == []
    assert time.monotonic() - started < 5
    assert "failed" not in caplog.text
