"""A table's state as of one instant, copied a chunk of slots at a time (copy-on-write).

A checkpoint used to copy the whole table on the event loop: at a million Atari items that
is ~50 MB of fresh pages and a pause of 0.1-0.4 s for every insert and sample. Here the
copy is taken in chunks of CHUNK slots, and the server yields to other calls between chunks;
the chunks are joined into one TableState later, off the loop (`assemble`). What the table
changes meanwhile must not leak into the copy, so the table tells the snapshot before it
writes:

- an insert writes whole slot ranges: the chunks they touch are copied first (`before_write`);
- a priority update writes scattered slots: their current priorities are saved, once each
  (`before_priority_write`), and put back into the copy when their chunk is copied;
- a sample that counts or removes items (max_times_sampled) writes scattered slots' keys,
  priorities and counts: the chunks they lie in are copied first (`before_slots_write`).

Counters (inserts, samples, max priority, ...) are read at the start. The state is then
exactly the table as it was when `Snapshot` was made, however calls interleave.
"""

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from apexrl.replay.frames import FrameRows, FrameStore
from apexrl.replay.state import TableState

if TYPE_CHECKING:  # the table imports this module
    from apexrl.replay.table import Table

CHUNK = 16_384  # slots: ~0.8 MB of copies for Atari items, a few ms each


@dataclass
class _Chunk:
    """The copies of one chunk of slots: the slots' own arrays apart from the columns, which
    may have any name ("priorities" too)."""

    slots: dict[str, np.ndarray]  # slot_keys, priorities and (if kept) times_sampled
    columns: dict[str, np.ndarray] = field(default_factory=dict)
    frames: dict[str, tuple[np.ndarray, ...]] = field(default_factory=dict)  # blobs, offsets, sizes


class Snapshot:
    """The copy of one table that the table tells before it writes."""

    def __init__(self, table: "Table") -> None:
        self.table = table
        self.used = table.used  # rows ever written: the copy's rows
        self.counters = {
            "inserts": table.inserts,
            "samples": table.samples,
            "priority_updates": table.priority_updates,
            "stale_priority_updates": table.stale_priority_updates,
        }
        self.max_priority = table.max_priority
        self.chunks: list[_Chunk | None] = [None] * -(-table.capacity // CHUNK)
        self.next_chunk = 0
        # Priorities overwritten before their chunk was copied: the values they had (zeros
        # map lazily: pages are touched only where updates land).
        self.saved = np.zeros(table.capacity, dtype=bool)
        self.saved_values = np.zeros(table.capacity, dtype=np.float64)

    @property
    def done(self) -> bool:
        return self.next_chunk >= len(self.chunks)

    def copy_next(self) -> None:
        """Copies the next chunk not copied yet; the last one detaches it from the table."""
        while not self.done and self.chunks[self.next_chunk] is not None:
            self.next_chunk += 1
        if not self.done:
            self._copy(self.next_chunk)
        if self.done and self.table._snapshot is self:  # the table's writes concern it no more
            self.table._snapshot = None

    def finish(self) -> TableState:
        """Copies what is left, then the TableState."""
        self.copy_next()
        while not self.done:
            self.copy_next()
        return self.assemble()

    def assemble(self) -> TableState:
        """The TableState from the copied chunks: touches no table, so any thread may call it
        once `done`."""
        table = self.table
        chunks = [c for c in self.chunks if c is not None]
        assert len(chunks) == len(self.chunks), "assembled before the copy was done"
        columns: dict[str, np.ndarray | FrameRows] = {}
        for name, column in table.columns.items():
            if isinstance(column, FrameStore):
                columns[name] = FrameRows(
                    *(np.concatenate([c.frames[name][i] for c in chunks]) for i in range(3))
                )
            else:
                columns[name] = np.concatenate([c.columns[name] for c in chunks])
        return TableState(
            name=table.name,
            capacity=table.capacity,
            alpha=table.alpha,
            signature=table.signature,
            rate_limiter=table.rate_limiter,
            max_batch_size=table.max_batch_size,
            slot_keys=np.concatenate([c.slots["slot_keys"] for c in chunks]),
            priorities=np.concatenate([c.slots["priorities"] for c in chunks]),
            columns=columns,
            sampler=table.sampler,
            remover=table.remover,
            max_times_sampled=table.max_times_sampled,
            times_sampled=None
            if table.times_sampled is None
            else np.concatenate([c.slots["times_sampled"] for c in chunks]),
            max_priority=self.max_priority,
            **self.counters,
        )

    def before_write(self, start: int, stop: int) -> None:
        """The table is about to write slots start .. stop - 1."""
        if stop > start:
            for chunk in range(start // CHUNK, (stop - 1) // CHUNK + 1):
                if self.chunks[chunk] is None:
                    self._copy(chunk)

    def before_slots_write(self, slots: np.ndarray) -> None:
        """The table is about to write these slots' keys, priorities and counts."""
        for chunk in np.unique(slots // CHUNK).tolist():
            if self.chunks[chunk] is None:
                self._copy(chunk)

    def before_priority_write(self, slots: np.ndarray) -> None:
        """The table is about to set the priorities of these (unique) slots."""
        copied = np.fromiter((c is not None for c in self.chunks), bool, len(self.chunks))
        pending = slots[~copied[slots // CHUNK] & ~self.saved[slots]]
        self.saved_values[pending] = self.table.priorities[pending]
        self.saved[pending] = True

    def _copy(self, chunk: int) -> None:
        table = self.table
        lo, hi = chunk * CHUNK, min((chunk + 1) * CHUNK, table.capacity)
        rows = slice(min(lo, self.used), min(hi, self.used))  # written rows only
        part = _Chunk(
            slots={
                "slot_keys": table.slot_keys[lo:hi].copy(),
                "priorities": np.where(
                    self.saved[lo:hi], self.saved_values[lo:hi], table.priorities[lo:hi]
                ),
            }
        )
        if table.times_sampled is not None:
            part.slots["times_sampled"] = table.times_sampled[lo:hi].copy()
        for name, column in table.columns.items():
            if isinstance(column, FrameStore):
                frames = (column.blobs[rows], column.offsets[rows], column.sizes[rows])
                part.frames[name] = tuple(a.copy() for a in frames)
            else:
                part.columns[name] = column[rows].copy()
        self.chunks[chunk] = part
