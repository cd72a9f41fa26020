"""Compressed columns: items compressed one by one in the clients, stored and sent as bytes.

A compressed column holds, per item, one zstd frame of the item's raw bytes (C order,
little-endian). Actors compress, the learner's input pipeline decompresses; the replay only
reads each frame's header (`content_size`: cheap, and no codec library in its image) to refuse
a value that is not a zstd frame or that declares a size other than the column's item size.

`Packed` is a batch of such items: their frames back to back in `data`, item i being
`sizes[i]` bytes, and the dtype and per-item shape they decompress to. One frame per item
keeps random access cheap (PER samples single items); what an item's parts share (a frame
stack and the stack after it) is paid for once because the codec sees them in one frame.
"""

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

CODECS = ("zstd",)
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
LEVEL = 6  # Pong n=3 items: 406 B at 48 µs vs 427 B at 18 µs (level 3); decoding ~18 µs either way


@dataclass(eq=False)  # holds bytes and arrays: compare fields instead
class Packed:
    """n compressed items of one column."""

    codec: str
    dtype: np.dtype  # of the decompressed items
    item_shape: tuple[int, ...]
    data: bytes | memoryview  # the items' frames, back to back (a view: held off the heap)
    sizes: np.ndarray  # uint32 [n], bytes of each item's frame

    def __len__(self) -> int:
        return len(self.sizes)

    @property
    def item_nbytes(self) -> int:
        return math.prod(self.item_shape) * np.dtype(self.dtype).itemsize

    def items(self) -> list[memoryview]:
        """Each item's frame, as a view into `data` (no copy)."""
        ends = np.cumsum(self.sizes, dtype=np.int64).tolist()
        view = memoryview(self.data)
        return [view[s:e] for s, e in zip([0, *ends[:-1]], ends, strict=True)]

    @classmethod
    def join(cls, codec: str, dtype, item_shape, items) -> "Packed":
        """Frames (a sequence of bytes-like objects) as one Packed."""
        sizes = np.fromiter(map(len, items), dtype=np.uint32, count=len(items))
        return cls(codec, np.dtype(dtype), tuple(item_shape), b"".join(items), sizes)


def concat(parts: list[dict]) -> dict:
    """Batches of the same columns end to end (compressed columns as one Packed)."""
    if len(parts) == 1:
        return parts[0]
    out = {}
    for name, column in parts[0].items():
        columns = [p[name] for p in parts]
        out[name] = (
            Packed(
                column.codec,
                column.dtype,
                column.item_shape,
                b"".join(c.data for c in columns),
                np.concatenate([c.sizes for c in columns]),
            )
            if isinstance(column, Packed)
            else np.concatenate(columns)
        )
    return out


def nbytes(columns: Mapping[str, np.ndarray | Packed]) -> int:
    """Bytes a batch's columns hold (compressed columns as compressed)."""
    return sum(
        len(c.data) + c.sizes.nbytes if isinstance(c, Packed) else c.nbytes
        for c in columns.values()
    )


def content_size(frame: bytes | memoryview) -> int | None:
    """The decompressed size a zstd frame header declares; None if `frame` does not start with
    a zstd frame header declaring one (or names a dictionary: apexrl uses none).

    Reads only the header (RFC 8878, 3.1.1): magic, descriptor, window, dictionary id, size.
    """
    if len(frame) < 6 or frame[:4] != ZSTD_MAGIC:
        return None
    descriptor = frame[4]
    if descriptor & 0x08 or descriptor & 0x03:  # reserved bit set, or a dictionary id
        return None
    single_segment = (descriptor >> 5) & 1
    size_bytes = (single_segment, 2, 4, 8)[descriptor >> 6]
    if size_bytes == 0:
        return None
    start = 5 + (0 if single_segment else 1)
    if len(frame) < start + size_bytes:
        return None
    value = int.from_bytes(frame[start : start + size_bytes], "little")
    return value + 256 if size_bytes == 2 else value


def check(items: Sequence[bytes | memoryview], item_nbytes: int) -> tuple[int, str] | None:
    """(index, reason) of the first frame that is not a zstd frame of item_nbytes, or None."""
    for i, frame in enumerate(items):
        size = content_size(frame)
        if size is None:
            return i, "is not a zstd frame declaring its size"
        if size != item_nbytes:
            return i, f"declares {size} decompressed bytes, the column's items have {item_nbytes}"
    return None


def compress(array: np.ndarray, codec: str = "zstd", level: int = LEVEL) -> Packed:
    """Compresses each item (array[i]) into its own frame."""
    import zstandard  # clients only: the replay never compresses

    if codec not in CODECS:
        raise ValueError(f"codec {codec!r} is not one of {CODECS}")
    array = np.ascontiguousarray(array)
    compressor = zstandard.ZstdCompressor(level=level, write_content_size=True)
    items = [compressor.compress(item) for item in array]
    return Packed.join(codec, array.dtype, array.shape[1:], items)


def decompress(packed: Packed) -> tuple[np.ndarray, np.ndarray]:
    """(items [n, *item_shape], ok bool [n]): an item whose frame is damaged or does not
    decompress to exactly the item size is left zero and marked not ok (never raises on data).
    """
    import zstandard

    n, nbytes = len(packed), packed.item_nbytes
    out = np.zeros((n, *packed.item_shape), dtype=packed.dtype)
    flat = out.view(np.uint8).reshape(n, nbytes)
    ok = np.zeros(n, dtype=bool)
    decompressor = zstandard.ZstdDecompressor()
    for i, frame in enumerate(packed.items()):
        if content_size(frame) != nbytes:  # refuses bombs before allocating anything
            continue
        try:
            raw = decompressor.decompress(frame, max_output_size=nbytes)
        except zstandard.ZstdError:
            continue
        if len(raw) == nbytes:
            flat[i] = np.frombuffer(raw, dtype=np.uint8)
            ok[i] = True
    return out, ok
