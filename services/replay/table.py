"""A replay table: fixed-capacity columnar storage, a sum tree, and a composition of a
sampler, a remover, max_times_sampled and a rate limiter. The default composition is
prioritized replay with FIFO eviction.

Semantics are those of protos/apexrl/v1/replay.proto. Items live in preallocated numpy
arrays, one per signature column, indexed by slot (replay/storage.py); the item with key k
(its insertion sequence number) lives in slot k % capacity until key k + capacity
overwrites it or it leaves after its max_times_sampled-th sample (its slot is then empty:
slot_keys -1, weight 0 in the sum tree, and only the key that maps there can use it again).

The table is composed of plain values, checked together once (replay/composition.py):

- sampler (replay/samplers.py): which items a batch holds;
- remover (replay/removers.py): what an insert does at capacity;
- max_times_sampled: 0 (unlimited) or k >= 1: an item leaves the table after its k-th
  sample, and a batch holds distinct items (fifo and lifo batches always do);
- rate limiter (replay/rate_limiters.py): when inserts and samples may go ahead.

Every mutating method validates its whole request before touching anything
(replay/table_checks.py), so a rejected request (InvalidArgument / FailedPrecondition) leaves
the table byte-for-byte unchanged, as digest() shows. The table is not thread-safe: the server
calls it from one event loop.
"""

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from apexrl.common.codec import Packed
from apexrl.common.errors import FailedPrecondition
from apexrl.replay.frames import FrameStore
from apexrl.replay.priorities import Priorities
from apexrl.replay.rate_limiters import QueueLimiter, RateLimiter
from apexrl.replay.removers import REMOVERS
from apexrl.replay.samplers import SAMPLERS
from apexrl.replay.signature import ColumnSpec, check_signature, signature_of
from apexrl.replay.snapshot import Snapshot
from apexrl.replay.state import TableState
from apexrl.replay.storage import Storage, hash_rows
from apexrl.replay.sumtree import SumTree
from apexrl.replay.table_checks import check_insert, check_sample, check_settings

# What an item costs beyond its columns: its key, its priority and its sum-tree leaf (the
# tree's nodes are 2 x its leaves).
_SLOT_NBYTES = 8 + 8 + 2 * 8


@dataclass(eq=False)  # holds arrays: == would be ambiguous
class SampleResult:
    columns: dict[str, np.ndarray | Packed]  # gathered copies, [batch_size, *column_shape]
    keys: np.ndarray  # int64 [batch_size]
    probabilities: np.ndarray  # float64 [batch_size], P(i) at sampling time
    weights: np.ndarray  # float32 [batch_size], largest is 1
    table_size: int


class Table:
    def __init__(
        self,
        name: str,
        capacity: int,
        *,
        sampler: str = "prioritized",
        remover: str = "fifo",
        max_times_sampled: int = 0,
        alpha: float = 0.6,
        rate_limiter: RateLimiter | QueueLimiter = RateLimiter(),  # noqa: B008 (frozen)
        signature: list[ColumnSpec] | None = None,
        max_batch_size: int = 65536,
        seed: int | None = None,
    ):
        check_settings(
            name, capacity, sampler, remover, max_times_sampled, alpha, rate_limiter, max_batch_size
        )
        self.name = name
        self.capacity = int(capacity)
        self.sampler = sampler
        self.remover = remover
        self.max_times_sampled = int(max_times_sampled)
        self.alpha = float(alpha)
        self.rate_limiter = rate_limiter
        self.max_batch_size = int(max_batch_size)
        self._sampler = SAMPLERS[sampler](np.random.default_rng(seed))
        self._remover = REMOVERS[remover]()

        self.slot_keys = np.full(self.capacity, -1, dtype=np.int64)
        self._priorities = Priorities(self.capacity, self.alpha)
        # Samples of the item in each slot: only kept when items leave after some.
        self.times_sampled = (
            np.zeros(self.capacity, dtype=np.int64) if self.max_times_sampled else None
        )
        self._held = 0  # items held, kept only when items can leave (size otherwise)
        # The largest insert and sample batches requested so far (a queue's: QueueLimiter).
        self._largest_insert = 0
        self._largest_sample = 0
        self.inserts = 0  # also the next key
        self.samples = 0
        self._storage = Storage(self.capacity)
        self._snapshot: Snapshot | None = None  # being taken: told before every write
        if signature is not None:
            self._storage.declare(check_signature(signature))

    @classmethod
    def queue(
        cls,
        name: str,
        capacity: int,
        *,
        max_times_sampled: int = 1,
        signature: list[ColumnSpec] | None = None,
        max_batch_size: int = 65536,
    ) -> "Table":
        """Reverb's Table.queue: items come out in insertion order, each once (by default);
        inserts wait when it is full, samples when it holds less than their batch."""
        return cls(
            name,
            capacity,
            sampler="fifo",
            remover="none",
            max_times_sampled=max_times_sampled,
            rate_limiter=QueueLimiter(),
            signature=signature,
            max_batch_size=max_batch_size,
        )

    # --- what it holds -----------------------------------------------------------------

    @property
    def signature(self) -> tuple[ColumnSpec, ...] | None:
        return self._storage.signature

    @property
    def columns(self) -> Mapping[str, np.ndarray | FrameStore]:
        """The storage arrays, [capacity, *shape] each; rows >= size are zeros."""
        return self._storage.columns

    @property
    def used(self) -> int:
        """Slots ever written: 0 .. used - 1."""
        return min(self.inserts, self.capacity)

    @property
    def size(self) -> int:
        """Items held."""
        return self._held if self.max_times_sampled else min(self.inserts, self.capacity)

    @property
    def removed(self) -> int:
        """Items that left: evicted at capacity or sampled max_times_sampled times."""
        return self.inserts - self.size

    @property
    def distinct(self) -> bool:
        """Whether a batch holds distinct items (then it needs batch_size items held)."""
        return self.max_times_sampled > 0 or self._sampler.always_distinct

    @property
    def priorities(self) -> np.ndarray:
        """float64 [capacity]: each slot's priority p (0 for an empty slot)."""
        return self._priorities.values

    @property
    def tree(self) -> SumTree:
        """The sum tree of p ** alpha over the slots."""
        return self._priorities.tree

    @property
    def max_priority(self) -> float:
        """The largest priority set so far: an insert's default."""
        return self._priorities.max_priority

    @property
    def priority_updates(self) -> int:
        return self._priorities.updates

    @property
    def stale_priority_updates(self) -> int:
        """Updates ignored: their item was overwritten or left."""
        return self._priorities.stale_updates

    def stored_priorities(self) -> np.ndarray:
        """The priorities of the items held."""
        if self.size == self.used:
            return self.priorities[: self.used]
        return self.priorities[: self.used][self.slot_keys[: self.used] >= 0]

    @property
    def total_priority(self) -> float:
        return self.tree.total

    @property
    def stored_bytes(self) -> int:
        """What the stored items take: fixed-size columns' rows, compressed frames (with their
        objects), and per item its key, priority and sum-tree leaf."""
        storage = self._storage
        return self.size * (_SLOT_NBYTES + storage.item_nbytes) + storage.frame_nbytes

    # --- insert ------------------------------------------------------------------------

    def validate_insert(
        self, columns: Mapping[str, np.ndarray | Packed], priorities: np.ndarray | None
    ) -> int:
        """Checks an insert without changing anything; returns its number of items."""
        n = check_insert(self, columns, priorities, self._largest_sample)
        self._largest_insert = max(self._largest_insert, n)
        return n

    def has_room(self, n: int) -> bool:
        """Whether the next n keys' slots are free, or may be overwritten (remover fifo)."""
        return self._remover.has_room(self.slot_keys, self.inserts, n)

    def insert(
        self, columns: Mapping[str, np.ndarray | Packed], priorities: np.ndarray | None = None
    ) -> int:
        """Inserts n items (remover fifo: overwriting the oldest when full); returns the first
        key. FailedPrecondition if remover "none" and the slots are not free (the server waits
        for can_insert first)."""
        n = self.validate_insert(columns, priorities)
        self.apply_priorities()
        if not self.has_room(n):
            raise FailedPrecondition(
                "table", f"table {self.name!r} is full (remover 'none'): no room for {n} items"
            )
        if self.signature is None:
            self._storage.declare(signature_of(columns))
        if priorities is None:
            p = np.full(n, self.max_priority)
        else:
            p = priorities.astype(np.float64)

        first = self.inserts
        start = first % self.capacity
        head = min(n, self.capacity - start)  # items before wrap-around
        if self._snapshot is not None:
            self._snapshot.before_write(start, start + head)
            self._snapshot.before_write(0, n - head)
        self._storage.write(start, head, columns)
        keys = np.arange(first, first + n, dtype=np.int64)
        slots = keys % self.capacity
        if self.times_sampled is not None:
            self._held += int(np.count_nonzero(self.slot_keys[slots] < 0))
            self.times_sampled[start : start + head] = 0
            self.times_sampled[: n - head] = 0
        self.slot_keys[start : start + head] = keys[:head]
        self.slot_keys[: n - head] = keys[head:]
        self._priorities.insert(start, head, slots, p)

        self.inserts += n
        self._sampler.inserted(self.inserts, self.capacity)
        return first

    # --- sample ------------------------------------------------------------------------

    def validate_sample(self, batch_size: int, beta: float) -> None:
        b = check_sample(self, batch_size, beta, self._largest_insert)
        self._largest_sample = max(self._largest_sample, b)

    def sample(self, batch_size: int, beta: float) -> SampleResult:
        """Samples a batch as the sampler says; ignores the rate limiter.

        The server waits for can_sample() first; this counts the samples, and removes the
        items sampled max_times_sampled times.
        """
        self.validate_sample(batch_size, beta)
        self.apply_priorities()
        size = self.size
        if size == 0:
            raise FailedPrecondition("table", f"table {self.name!r} is empty")
        b = int(batch_size)
        if self.distinct and size < b:
            raise FailedPrecondition(
                "batch_size",
                f"table {self.name!r} holds {size} items, fewer than batch_size {b}"
                " (its batches hold distinct items)",
            )
        slots, probabilities, weights = self._sampler.select(self, b, beta)
        result = SampleResult(
            columns=self._storage.gather(slots),
            keys=self.slot_keys[slots],
            probabilities=probabilities,
            weights=weights,
            table_size=size,
        )
        self.samples += b
        if self.max_times_sampled:
            self._count_samples(slots)
        return result

    def _count_samples(self, slots: np.ndarray) -> None:
        """One more sample for each (distinct) slot; the items at max_times_sampled leave."""
        assert self.times_sampled is not None  # kept when max_times_sampled > 0
        if self._snapshot is not None:
            self._snapshot.before_slots_write(slots)
        self.times_sampled[slots] += 1
        done = slots[self.times_sampled[slots] >= self.max_times_sampled]
        if len(done):
            self.slot_keys[done] = -1
            self.times_sampled[done] = 0
            self._priorities.clear(done)
            self._held -= len(done)

    # --- priorities --------------------------------------------------------------------

    def update_priorities(self, keys: np.ndarray, priorities: np.ndarray) -> tuple[int, int]:
        """Sets priorities of live keys; returns (updated, stale). Last duplicate wins."""
        counts = self.stage_priorities(keys, priorities)
        self.apply_priorities()
        return counts

    def stage_priorities(self, keys: np.ndarray, priorities: np.ndarray) -> tuple[int, int]:
        """update_priorities' checks and counts, with the writes left for apply_priorities.

        The server answers after this and writes after its answer, so the sum-tree work
        overlaps the caller's next call. Every method here that reads or replaces priorities,
        keys or the tree applies the staged updates first, so no one sees them missing.
        """
        return self._priorities.stage(self.slot_keys, self.inserts, keys, priorities)

    def apply_priorities(self) -> None:
        """Writes the staged priority updates, in the order they came (the last one for a slot
        wins). No insert or removal comes between staging and this: those apply first."""
        self._priorities.apply(self._snapshot)

    # --- rate limiter ------------------------------------------------------------------

    def can_insert(self, n: int = 1) -> bool:
        """Whether an insert of n items may go ahead now (the limiter, and room for them)."""
        return self.rate_limiter.can_insert(self.inserts, self.samples) and self.has_room(n)

    def can_sample(self, batch_size: int = 1) -> bool:
        """Whether a batch may be sampled now (the limiter, and enough items if distinct)."""
        size = self.size
        if self.distinct and size < batch_size:
            return False
        return self.rate_limiter.can_sample(self.inserts, self.samples, size)

    # --- digest, snapshot, restore -----------------------------------------------------

    def _config_json(self) -> dict:
        return {
            "name": self.name,
            "capacity": self.capacity,
            "sampler": self.sampler,
            "remover": self.remover,
            "max_times_sampled": self.max_times_sampled,
            "alpha": self.alpha,
            "rate_limiter": self.rate_limiter.to_json(),
            "max_batch_size": self.max_batch_size,
            "signature": None if self.signature is None else [s.to_json() for s in self.signature],
        }

    def digest(self) -> str:
        """sha256 of the whole state: equal digests mean byte-for-byte equal tables."""
        self.apply_priorities()
        h = hashlib.sha256()
        meta = self._config_json() | {
            "inserts": self.inserts,
            "samples": self.samples,
            "priority_updates": self.priority_updates,
            "stale_priority_updates": self.stale_priority_updates,
            "max_priority": self.max_priority.hex(),
            "alpha": self.alpha.hex(),  # hex: exact, whatever repr does
        }
        h.update(json.dumps(meta, sort_keys=True).encode())
        used = self.used  # slots never written are all -1, 0, zeros
        arrays = [self.slot_keys, self.priorities, *self.columns.values()]
        if self.times_sampled is not None:
            arrays.append(self.times_sampled)
        for array in arrays:
            hash_rows(h, array, used)
        # The tree is derived from priorities, but a bug there would change sampling.
        h.update(self.tree.values.data)
        return h.hexdigest()

    def snapshot(self) -> TableState:
        """A consistent copy of the state, taken at once."""
        return self.begin_snapshot().finish()

    def begin_snapshot(self) -> Snapshot:
        """A copy of the state as of now, taken a chunk at a time (`Snapshot.copy_next`) while
        the table goes on changing: the server's checkpoints yield between chunks."""
        self.apply_priorities()
        if self._snapshot is not None:  # one snapshot at a time: the older one completes first
            self._snapshot.finish()
        self._snapshot = Snapshot(self)
        return self._snapshot

    @classmethod
    def from_state(
        cls, state: TableState, *, max_batch_size: int | None = None, seed: int | None = None
    ) -> "Table":
        """A new table configured as the state says, holding its items."""
        table = cls(
            state.name,
            state.capacity,
            sampler=state.sampler,
            remover=state.remover,
            max_times_sampled=state.max_times_sampled,
            alpha=state.alpha,
            rate_limiter=state.rate_limiter,
            signature=None if state.signature is None else list(state.signature),
            max_batch_size=state.max_batch_size if max_batch_size is None else max_batch_size,
            seed=seed,
        )
        table.restore(state)
        return table

    def restore(self, state: TableState) -> None:
        """Replaces this table's contents with a state's; ValueError naming the field if
        the state disagrees with this table's configuration or is inconsistent.

        The configured rate limiter and max_batch_size are kept (they may be retuned
        between runs); capacity, sampler, remover, max_times_sampled, alpha and signature
        must match.
        """
        state.check_fits(self)
        if self._snapshot is not None:  # one in progress keeps the contents it began with
            self._snapshot.finish()
        size, old_size = state.used, self.used
        if state.signature is not None and self.signature is None:
            self._storage.declare(tuple(state.signature))
        self._storage.restore(state.columns, size, old_size)
        self.slot_keys[:] = state.slot_keys
        self._priorities.restore(state)  # with the updates staged for the contents replaced
        if self.times_sampled is not None:
            assert state.times_sampled is not None  # check_fits: the same max_times_sampled
            self.times_sampled[:] = state.times_sampled
        self._held = state.size
        self._sampler.restored(int(state.inserts), self.capacity)
        self.inserts = int(state.inserts)
        self.samples = int(state.samples)
