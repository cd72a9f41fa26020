"""Storage of a compressed column: each slot points at its item's frame inside the bytes object
it arrived in.

An insert's frames come back to back in one bytes object (the wire tensor's data). Slots keep
a reference to that object, the frame's offset and its size, so the 64 frames of an actor's
insert share one object: 16 bytes per item (pointer, offset, size) where a bytes object per
item would cost 41 bytes plus allocator rounding. FIFO eviction overwrites an insert's slots
together, so a bytes object is freed when its last item is overwritten: memory is the live
frames plus at most one partly overwritten insert. Copies (a checkpoint's snapshot) copy the
three arrays, never the frames.
"""

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from apexrl.common.codec import Packed

# Items per bytes object when frames are rebuilt from a checkpoint: small enough that memory
# frees as they are overwritten, large enough that the object header is shared.
CHUNK = 64
# Frames joined per step when a checkpoint copies them out (~2 MB of Pong frames).
JOIN_ITEMS = 4096


@dataclass(eq=False)  # holds arrays
class FrameRows:
    """Where each item's frame lies: blob[offset : offset + size]."""

    blobs: np.ndarray  # object [n], bytes
    offsets: np.ndarray  # uint32 [n]
    sizes: np.ndarray  # uint32 [n]

    def __len__(self) -> int:
        return len(self.sizes)

    def spans(self, count: int | None = None) -> Iterator[memoryview]:
        """The first `count` (all) items' frames back to back, as few views as possible: the
        frames of one insert lie side by side in one object, and make one view."""
        count = len(self) if count is None else count
        if not count:
            return iter(())
        blobs, offsets, sizes = self.blobs[:count], self.offsets[:count], self.sizes[:count]
        ids = np.fromiter(map(id, blobs), dtype=np.int64, count=count)
        ends = offsets.astype(np.int64) + sizes
        # A span starts where the object changes or the frame does not follow the previous one.
        starts = np.flatnonzero(np.r_[True, (ids[1:] != ids[:-1]) | (offsets[1:] != ends[:-1])])
        lasts = np.r_[starts[1:], count] - 1
        return (
            memoryview(blobs[first])[int(offsets[first]) : int(ends[last])]
            for first, last in zip(starts.tolist(), lasts.tolist(), strict=True)
        )

    def data(self) -> np.ndarray:
        """The frames back to back (uint8), joined a few thousand at a time: a checkpoint's
        writer thread calls this, and one join of every frame would hold the GIL (and the
        replay's event loop) for a whole copy of the table's frames."""
        out = np.empty(int(self.sizes.sum(dtype=np.int64)), dtype=np.uint8)
        position = 0
        for first in range(0, len(self), JOIN_ITEMS):
            last = min(first + JOIN_ITEMS, len(self))
            chunk = FrameRows(
                self.blobs[first:last], self.offsets[first:last], self.sizes[first:last]
            )
            joined = b"".join(chunk.spans())
            out[position : position + len(joined)] = np.frombuffer(joined, dtype=np.uint8)
            position += len(joined)
        return out

    def copy(self, count: int) -> "FrameRows":
        return FrameRows(
            self.blobs[:count].copy(), self.offsets[:count].copy(), self.sizes[:count].copy()
        )

    @classmethod
    def from_data(cls, data: bytes, sizes: np.ndarray) -> "FrameRows":
        """Rows from frames back to back (a checkpoint's), in bytes objects of CHUNK items."""
        n = len(sizes)
        ends = np.cumsum(sizes, dtype=np.int64)
        starts = ends - sizes
        blobs = np.empty(n, dtype=object)
        offsets = np.zeros(n, dtype=np.uint32)
        view = memoryview(data)
        for first in range(0, n, CHUNK):
            last = min(first + CHUNK, n)
            base = int(starts[first])
            blobs[first:last] = bytes(view[base : int(ends[last - 1])])
            offsets[first:last] = starts[first:last] - base
        return cls(blobs, offsets, np.asarray(sizes, dtype=np.uint32))


EMPTY_ROWS = FrameRows.from_data(b"", np.zeros(0, dtype=np.uint32))


class FrameStore(FrameRows):
    """A compressed column of `capacity` slots; `nbytes` counts the live frames."""

    def __init__(self, capacity: int):
        super().__init__(
            np.full(capacity, b"", dtype=object),
            np.zeros(capacity, dtype=np.uint32),
            np.zeros(capacity, dtype=np.uint32),
        )
        self.nbytes = 0

    def put(self, start: int, head: int, packed: Packed) -> None:
        """Writes the n items to slots start .. start + head - 1, then 0 .. n - head - 1."""
        n, blob = len(packed), bytes(packed.data)  # bytes() is free when it is bytes already
        offsets = (np.cumsum(packed.sizes, dtype=np.int64) - packed.sizes).astype(np.uint32)
        for slots, items in (
            (slice(start, start + head), slice(0, head)),
            (slice(0, n - head), slice(head, n)),
        ):
            self.nbytes += int(packed.sizes[items].sum()) - int(self.sizes[slots].sum())
            self.blobs[slots] = blob
            self.offsets[slots] = offsets[items]
            self.sizes[slots] = packed.sizes[items]

    def gather(
        self, slots: np.ndarray, codec: str, dtype: np.dtype, item_shape: tuple[int, ...]
    ) -> Packed:
        parts = zip(
            self.blobs[slots], self.offsets[slots].tolist(), self.sizes[slots].tolist(), strict=True
        )
        data = b"".join(memoryview(blob)[offset : offset + size] for blob, offset, size in parts)
        return Packed(codec, np.dtype(dtype), tuple(item_shape), data, self.sizes[slots])

    def restore(self, rows: FrameRows, old_size: int) -> None:
        """Rows 0 .. len(rows) - 1 from a snapshot; rows this store held beyond are emptied."""
        size = len(rows)
        self.blobs[:size], self.offsets[:size], self.sizes[:size] = (
            rows.blobs,
            rows.offsets,
            rows.sizes,
        )
        self.blobs[size:old_size], self.offsets[size:old_size], self.sizes[size:old_size] = (
            b"",
            0,
            0,
        )
        self.nbytes = int(self.sizes[:size].sum(dtype=np.int64))
