"""A table's priorities: each slot's priority p, the sum tree of p^alpha that prioritized
sampling draws from, and UpdatePriorities' writes, checked and counted at once and written
later; with the checks of priorities and of the keys they are set for (InvalidArgument naming
the field, "priorities" or "keys", and the value)."""

import threading

import numpy as np

from apexrl.common.errors import InvalidArgument
from apexrl.replay.snapshot import Snapshot
from apexrl.replay.state import TableState
from apexrl.replay.sumtree import SumTree, last_occurrence

_PRIORITY_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
_KEY_DTYPES = (np.dtype(np.int64), np.dtype(np.uint64))
# UpdatePriorities batches are small arrays of keys, not items: a generous separate limit.
MAX_UPDATE_BATCH = 1 << 20


def check_priorities(priorities: object, n: int, what: str) -> np.ndarray:
    """Returns the priorities as float64 [n]; InvalidArgument('priorities', ...) if bad."""
    if not isinstance(priorities, np.ndarray):
        raise InvalidArgument("priorities", f"must be an array, got {type(priorities).__name__}")
    if priorities.dtype not in _PRIORITY_DTYPES:
        raise InvalidArgument(
            "priorities", f"dtype must be float32 or float64, got {priorities.dtype}"
        )
    if priorities.shape != (n,):
        raise InvalidArgument(
            "priorities", f"shape must be [{n}] ({what}), got {list(priorities.shape)}"
        )
    p = priorities.astype(np.float64)
    # A NaN makes min and max NaN and both comparisons False: two reductions check it all.
    if not (p.min() >= 0 and p.max() < np.inf):
        i = int(np.argmax(~np.isfinite(p) | (p < 0)))
        raise InvalidArgument("priorities", f"must be finite and >= 0, got {p[i]} at index {i}")
    return p


def check_update(keys: object, priorities: object) -> np.ndarray:
    """Checks an update's keys (1-D int64 >= 0 or uint64, 1 to MAX_UPDATE_BATCH of them) and its
    priorities (one per key); returns the priorities as float64."""
    if not isinstance(keys, np.ndarray):
        raise InvalidArgument("keys", f"must be an array, got {type(keys).__name__}")
    if keys.dtype not in _KEY_DTYPES:
        raise InvalidArgument("keys", f"dtype must be int64 or uint64, got {keys.dtype}")
    if keys.ndim != 1:
        raise InvalidArgument("keys", f"must be 1-D, got shape {list(keys.shape)}")
    n = len(keys)
    if not 1 <= n <= MAX_UPDATE_BATCH:
        raise InvalidArgument("keys", f"must hold 1 to {MAX_UPDATE_BATCH} keys, got {n}")
    if keys.dtype == np.int64 and keys.min() < 0:
        i = int(np.argmax(keys < 0))
        raise InvalidArgument("keys", f"must be >= 0, got {keys[i]} at index {i}")
    return check_priorities(priorities, n, "one per key")


class Priorities:
    """The priorities of a table's slots (0 for an empty one) and their sum tree.

    An update is staged (`stage`: checked and counted, the answer known) and written later
    (`apply`), so the server's answer goes out before the sum-tree work. The table applies the
    staged updates before anything reads or replaces priorities, keys or the tree, so no one
    sees them missing; the lock lets another thread (an in-process test reading the table)
    apply them safely.
    """

    def __init__(self, capacity: int, alpha: float):
        self.alpha = alpha
        self.values = np.zeros(capacity, dtype=np.float64)  # raw p (not p ** alpha)
        self.tree = SumTree(capacity)  # p ** alpha; 0 ** 0 == 1: alpha 0 is uniform
        self.max_priority = 1.0  # the largest set so far: an insert's default
        self.updates = 0  # priorities set by updates
        self.stale_updates = 0  # updates ignored: their item was overwritten or left
        self._staged: list[tuple[np.ndarray, np.ndarray]] = []
        self._applying = threading.Lock()

    def insert(self, start: int, head: int, slots: np.ndarray, p: np.ndarray) -> None:
        """New items' priorities, float64 [n], in their slots: start .. start + head - 1, then
        (past the end) 0 .. n - head - 1."""
        n = len(p)
        self.values[start : start + head] = p[:head]
        self.values[: n - head] = p[head:]
        self.tree.set(slots, p**self.alpha)
        self.max_priority = max(self.max_priority, float(p.max()))

    def clear(self, slots: np.ndarray) -> None:
        """The items in these (distinct) slots left."""
        self.values[slots] = 0.0
        self.tree.set(slots, np.zeros(len(slots)))

    def stage(
        self, slot_keys: np.ndarray, inserts: int, keys: np.ndarray, priorities: np.ndarray
    ) -> tuple[int, int]:
        """Checks an update and counts it; returns (updated, stale). The writes wait for
        `apply`. slot_keys and inserts are the table's keys: only keys held are updated."""
        p = check_update(keys, priorities)
        # Keys >= inserts were never written, so they are stale; clipping to inserts
        # keeps them stale and brings huge uint64 keys into int64 range.
        k = np.minimum(keys, inserts).astype(np.int64, copy=False)
        slots = k % len(slot_keys)
        live = slot_keys[slots] == k
        updated = int(np.count_nonzero(live))
        if updated:
            if updated < len(k):
                slots, p = slots[live], p[live]
            with self._applying:
                self._staged.append((slots, p))
        self.updates += updated
        self.stale_updates += len(k) - updated
        return updated, len(k) - updated

    def apply(self, snapshot: Snapshot | None) -> None:
        """Writes the staged updates, in the order they came (the last one for a slot wins),
        telling the snapshot being taken (replay/snapshot.py), if any, first."""
        with self._applying:  # a thread finds the writes of another one complete
            staged, self._staged = self._staged, []
            if not staged:
                return
            slots = np.concatenate([s for s, _ in staged]) if len(staged) > 1 else staged[0][0]
            p = np.concatenate([p for _, p in staged]) if len(staged) > 1 else staged[0][1]
            unique_slots, last = last_occurrence(slots)
            new = p[last]
            if snapshot is not None:
                snapshot.before_priority_write(unique_slots)
            self.values[unique_slots] = new
            self.tree.set(unique_slots, new**self.alpha, distinct=True)
            self.max_priority = max(self.max_priority, float(new.max()))

    def restore(self, state: TableState) -> None:
        """Replaces the priorities, staged ones dropped, and counters with a (checked) state's."""
        self._staged = []
        self.values[:] = state.priorities
        self.tree.reset(np.where(state.slot_keys >= 0, self.values**self.alpha, 0.0))
        self.updates = int(state.priority_updates)
        self.stale_updates = int(state.stale_priority_updates)
        self.max_priority = float(state.max_priority)
