"""A table's items, column by column: one preallocated array per signature column, indexed by
slot (a FrameStore for a compressed column: replay/frames.py).

np.zeros maps pages lazily, so resident memory grows as slots are first written; a compressed
column's memory follows the frames stored, at most capacity x the largest frame the codec can
declare for the item size.
"""

import hashlib
from collections.abc import Mapping

import numpy as np

from apexrl.common.codec import Packed
from apexrl.replay.frames import EMPTY_ROWS, FrameRows, FrameStore
from apexrl.replay.signature import ColumnSpec

# What a compressed item costs beyond its frame: FrameStore's pointer, offset and size.
PACKED_ITEM_OVERHEAD = 8 + 4 + 4


class Storage:
    def __init__(self, capacity: int):
        self.capacity = capacity
        self.signature: tuple[ColumnSpec, ...] | None = None  # fixed by declare
        self.columns: dict[str, np.ndarray | FrameStore] = {}

    def declare(self, specs: tuple[ColumnSpec, ...]) -> None:
        """Allocates a column per spec; the signature is fixed from then on."""
        columns = {
            s.name: FrameStore(self.capacity)
            if s.codec
            else np.zeros((self.capacity, *s.shape), dtype=s.dtype)
            for s in specs
        }
        self.columns = columns  # assigned only once every allocation succeeded
        self.signature = specs

    def write(self, start: int, head: int, batch: Mapping[str, np.ndarray | Packed]) -> None:
        """Writes a batch's n items to slots start .. start + head - 1, then (past the end)
        0 .. n - head - 1."""
        # Contiguous slice copies (at most two, n <= capacity): rows can be tens of KB,
        # where fancy indexing would be far slower.
        for name, array in batch.items():
            column = self.columns[name]
            if isinstance(column, FrameStore):
                assert isinstance(array, Packed)  # check_batch: a compressed column's items
                column.put(start, head, array)
                continue
            assert isinstance(array, np.ndarray)  # check_batch: a plain column's items
            column[start : start + head] = array[:head]
            column[: len(array) - head] = array[head:]

    def gather(self, slots: np.ndarray) -> dict[str, np.ndarray | Packed]:
        """Copies of the items in these slots, [len(slots), *column shape] each."""
        assert self.signature is not None  # items were inserted, so it was declared
        out: dict[str, np.ndarray | Packed] = {}
        for spec in self.signature:
            column = self.columns[spec.name]
            if isinstance(column, FrameStore):
                assert spec.codec is not None  # declare: compressed columns only
                out[spec.name] = column.gather(slots, spec.codec, spec.dtype, spec.shape)
            else:
                out[spec.name] = np.take(column, slots, axis=0)
        return out

    def restore(self, rows: Mapping[str, np.ndarray | FrameRows], size: int, old_size: int) -> None:
        """Replaces the first `size` rows with a state's, and clears the rows up to `old_size`
        that this storage had written."""
        for name, column in self.columns.items():
            if isinstance(column, FrameStore):
                frames = rows[name] if size else EMPTY_ROWS
                assert isinstance(frames, FrameRows)  # the state's check_fits
                column.restore(frames, old_size)
                continue
            if size:  # a state without items may have no signature and no columns
                column[:size] = rows[name]
            # Only rows this storage wrote: zeroing the rest would touch every page.
            column[size:old_size] = 0

    @property
    def item_nbytes(self) -> int:
        """What one item takes beyond its compressed frames: its fixed-size rows, and for each
        compressed column FrameStore's pointer, offset and size."""
        return sum(PACKED_ITEM_OVERHEAD if s.codec else s.item_nbytes for s in self.signature or ())

    @property
    def frame_nbytes(self) -> int:
        """What the compressed columns' frames take, with their bytes objects."""
        return sum(c.nbytes for c in self.columns.values() if isinstance(c, FrameStore))


def hash_rows(h: "hashlib._Hash", column: np.ndarray | FrameStore, rows: int) -> None:
    """Feeds a column's first `rows` rows to a hash: a compressed column's frame sizes, then
    its frames."""
    if isinstance(column, FrameStore):
        h.update(column.sizes[:rows].data)
        for span in column.spans(rows):
            h.update(span)
    else:
        h.update(np.ascontiguousarray(column[:rows]).data)
