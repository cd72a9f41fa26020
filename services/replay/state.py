"""A table's complete state, as copies: what a snapshot takes, a checkpoint holds and a restore
puts back (replay/snapshot.py, replay/checkpoint.py, Table.restore)."""

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from apexrl.replay.frames import FrameRows
from apexrl.replay.rate_limiters import QueueLimiter, RateLimiter
from apexrl.replay.signature import ColumnSpec
from apexrl.replay.validation import is_int

if TYPE_CHECKING:  # the table imports this module
    from apexrl.replay.table import Table


@dataclass(eq=False)  # holds arrays: compare Table digests instead
class TableState:
    """A table's complete state, as copies: what a checkpoint holds.

    columns hold only the rows ever written, 0 .. used - 1 (slots fill from 0; a slot
    emptied by max_times_sampled keeps its row as it was), a compressed column as FrameRows
    (where each item's frame lies); slot_keys, priorities and times_sampled hold all
    `capacity` slots. Scan cursors are not kept: they follow from slot_keys.
    """

    name: str
    capacity: int
    alpha: float
    signature: tuple[ColumnSpec, ...] | None
    rate_limiter: RateLimiter | QueueLimiter
    max_batch_size: int
    inserts: int
    samples: int
    priority_updates: int
    stale_priority_updates: int
    max_priority: float
    slot_keys: np.ndarray  # int64 [capacity], -1 = empty
    priorities: np.ndarray  # float64 [capacity], raw p (0 for empty slots)
    columns: dict[str, np.ndarray | FrameRows] = field(default_factory=dict)
    sampler: str = "prioritized"
    remover: str = "fifo"
    max_times_sampled: int = 0
    times_sampled: np.ndarray | None = None  # int64 [capacity] when max_times_sampled > 0

    @property
    def used(self) -> int:
        return min(self.inserts, self.capacity)

    @property
    def size(self) -> int:
        """Items held."""
        return int(np.count_nonzero(self.slot_keys >= 0))

    def check_fits(self, table: "Table") -> None:
        """ValueError naming the field unless the state can be restored into `table` (a
        Table): configured as it is, and consistent (counters, the arrays' dtypes and shapes,
        keys that follow from inserts, priorities and counts of empty slots, columns as the
        signature says)."""
        self._check_settings(table)
        for counter in ("inserts", "samples", "priority_updates", "stale_priority_updates"):
            value = getattr(self, counter)
            if not is_int(value) or value < 0:
                raise ValueError(f"{counter}: must be an integer >= 0, got {value!r}")
        if not math.isfinite(self.max_priority) or self.max_priority < 0:
            raise ValueError(f"max_priority: must be finite and >= 0, got {self.max_priority}")
        self._check_slots()
        self._check_columns()

    def _check_settings(self, table: "Table") -> None:
        if self.name != table.name:
            raise ValueError(f"name: state has {self.name!r}, table is {table.name!r}")
        if self.capacity != table.capacity:
            raise ValueError(f"capacity: state has {self.capacity}, table has {table.capacity}")
        if self.alpha != table.alpha:
            raise ValueError(f"alpha: state has {self.alpha}, table has {table.alpha}")
        for setting in ("sampler", "remover", "max_times_sampled"):
            ours, theirs = getattr(table, setting), getattr(self, setting)
            if theirs != ours:
                raise ValueError(
                    f"{setting}: state of table {table.name!r} has {theirs!r}, table has {ours!r}"
                )
        sig = None if self.signature is None else tuple(self.signature)
        if sig is not None and table.signature is not None and sig != table.signature:
            raise ValueError(f"signature: state has {sig}, table has {table.signature}")

    def _check_slots(self) -> None:
        cap, k = self.capacity, self.max_times_sampled
        arrays: list[tuple[str, np.ndarray | None, type[np.generic]]] = [
            ("slot_keys", self.slot_keys, np.int64),
            ("priorities", self.priorities, np.float64),
        ]
        if k:
            arrays.append(("times_sampled", self.times_sampled, np.int64))
        elif self.times_sampled is not None:
            raise ValueError("times_sampled: present, but max_times_sampled is 0")
        for name, array, dtype in arrays:
            if not isinstance(array, np.ndarray) or array.dtype != dtype or array.shape != (cap,):
                raise ValueError(f"{name}: must be {np.dtype(dtype)} [{cap}]")
        # Keys are insertion numbers, so the slots' keys follow from inserts alone: slot s
        # holds the newest key k < inserts with k % capacity == s, or -1 when it was never
        # written or (only with max_times_sampled) its item left.
        slots = np.arange(cap, dtype=np.int64)
        newest = self.inserts - 1 - (self.inserts - 1 - slots) % cap
        expected = np.where(slots < self.used, newest, -1)
        matches = self.slot_keys == expected
        if k:
            matches |= self.slot_keys == -1
        if not matches.all():
            raise ValueError(f"slot_keys: inconsistent with inserts = {self.inserts}")
        empty = self.slot_keys < 0
        p = self.priorities
        if not (np.isfinite(p).all() and (p >= 0).all() and (p[empty] == 0).all()):
            raise ValueError("priorities: must be finite, >= 0, and 0 for empty slots")
        t = self.times_sampled
        if t is not None:  # kept exactly when k > 0 (checked above)
            if not ((t >= 0).all() and (t < k).all() and (t[empty] == 0).all()):
                raise ValueError(f"times_sampled: must be in [0, {k}) and 0 for empty slots")

    def _check_columns(self) -> None:
        size = self.used  # the rows the columns hold
        if self.signature is None:
            # The first insert fixes the signature, so a state without one is empty.
            if self.columns or size:
                raise ValueError("signature: missing, but the state holds items or columns")
            return
        if set(self.columns) != {s.name for s in self.signature}:
            raise ValueError(f"columns: {sorted(self.columns)} do not match the signature")
        for s in self.signature:
            array = self.columns[s.name]
            if s.codec:
                if not isinstance(array, FrameRows) or len(array) != size:
                    raise ValueError(f'columns["{s.name}"]: must be FrameRows of {size} items')
                continue
            if not isinstance(array, np.ndarray):
                raise ValueError(
                    f'columns["{s.name}"]: must be an array, got {type(array).__name__}'
                )
            if array.dtype != s.dtype or array.shape != (size, *s.shape):
                raise ValueError(
                    f'columns["{s.name}"]: must be {s.dtype} {[size, *s.shape]},'
                    f" got {array.dtype} {list(array.shape)}"
                )
