"""A replay table: fixed-capacity columnar storage, a sum tree, and a composition of a
sampler, a remover, max_times_sampled and a rate limiter (replay/samplers.py). The default
composition is prioritized replay with FIFO eviction.

Semantics are those of protos/apexrl/v1/replay.proto. Items live in preallocated numpy
arrays, one per signature column, indexed by slot; the item with key k (its insertion
sequence number) lives in slot k % capacity until key k + capacity overwrites it or it
leaves after its max_times_sampled-th sample (its slot is then empty: slot_keys -1).

Every mutating method validates its whole request before touching anything, so a
rejected request (InvalidArgument / FailedPrecondition) leaves the table byte-for-byte
unchanged, as digest() shows. The table is not thread-safe: the server calls it from
one event loop.
"""

import hashlib
import json
import math
import numbers
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from apexrl.common import codec
from apexrl.common.codec import Packed
from apexrl.common.errors import FailedPrecondition, InvalidArgument
from apexrl.replay.frames import EMPTY_ROWS, FrameRows, FrameStore
from apexrl.replay.samplers import (
    QueueLimiter,
    check_composition,
    distinct_prioritized_slots,
    held_keys,
    stratified_slots,
    uniform_slots,
)
from apexrl.replay.snapshot import Snapshot
from apexrl.replay.sumtree import SumTree, last_occurrence

# The dtypes apexrl.v1.DType can carry (all little-endian; '<f4' == '=f4' here).
ALLOWED_DTYPES = frozenset(
    np.dtype(s)
    for s in ("<f2", "<f4", "<f8", "i1", "<i2", "<i4", "<i8", "u1", "<u2", "<u4", "<u8", "?")
)
_PRIORITY_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
_KEY_DTYPES = (np.dtype(np.int64), np.dtype(np.uint64))
# UpdatePriorities batches are small arrays of keys, not items: a generous separate limit.
MAX_UPDATE_BATCH = 1 << 20
_MAX_NAME_LENGTH = 256


def _check_name(name: object, what: str) -> None:
    if not isinstance(name, str) or not name or len(name) > _MAX_NAME_LENGTH:
        raise ValueError(f"{what} must be a non-empty string of <= {_MAX_NAME_LENGTH} chars")
    if not name.isprintable():
        raise ValueError(f"{what} {name!r} has non-printable characters")


# What a compressed item costs beyond its frame: FrameStore's pointer, offset and size.
PACKED_ITEM_OVERHEAD = 8 + 4 + 4


@dataclass(frozen=True)
class ColumnSpec:
    """One signature column: the dtype and shape of a single item, and optionally the closed
    range [low, high] its values must lie in (an env's action bounds), or the codec its items
    arrive compressed with (common/codec.py: the table stores each item's frame as it came)."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    bounds: tuple[float, float] | None = None
    codec: str | None = None

    def __post_init__(self) -> None:
        _check_name(self.name, "column name")
        dtype = np.dtype(self.dtype)
        if dtype not in ALLOWED_DTYPES:
            raise ValueError(f"column {self.name!r}: dtype {dtype} is not a wire dtype")
        shape = tuple(int(d) for d in self.shape)
        if any(d < 0 for d in shape):
            raise ValueError(f"column {self.name!r}: negative dimension in shape {shape}")
        if self.bounds is not None:
            low, high = (float(b) for b in self.bounds)
            if not low <= high:  # NaN fails too
                raise ValueError(f"column {self.name!r}: bounds [{low}, {high}] are empty")
            object.__setattr__(self, "bounds", (low, high))
        if self.codec is not None:
            if self.codec not in codec.CODECS:
                raise ValueError(
                    f"column {self.name!r}: codec {self.codec!r} not in {codec.CODECS}"
                )
            if self.bounds is not None:
                raise ValueError(f"column {self.name!r}: a compressed column cannot have bounds")
        # Normalized so that equal specs compare equal however they were spelled.
        object.__setattr__(self, "dtype", dtype)
        object.__setattr__(self, "shape", shape)

    def to_json(self) -> dict:
        out = {"name": self.name, "dtype": self.dtype.str, "shape": list(self.shape)}
        if self.bounds is not None:
            out["bounds"] = list(self.bounds)
        if self.codec is not None:
            out["codec"] = self.codec
        return out

    @classmethod
    def from_json(cls, obj: dict) -> "ColumnSpec":
        bounds = obj.get("bounds")
        return cls(
            obj["name"],
            np.dtype(obj["dtype"]),
            tuple(obj["shape"]),
            bounds and tuple(bounds),
            obj.get("codec"),
        )

    @property
    def item_nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


@dataclass(frozen=True)
class RateLimiter:
    """Reverb's SampleToInsertRatio limiter, adapted to batches so it can never deadlock.

    With diff = inserts * samples_per_insert - samples (samples counted in items):

    - sampling needs size >= min_size_to_sample and, if samples_per_insert > 0,
      diff > min_diff = samples_per_insert * min_size_to_sample - error_buffer;
    - inserting needs, if samples_per_insert > 0,
      diff < max_diff = samples_per_insert * min_size_to_sample + error_buffer.

    A batch is admitted when the limiter is inside its window *before* the batch, and
    may overshoot the window by its own size. Reverb instead requires the state after
    the batch to be inside the window, which deadlocks any batch larger than the window
    (2 * error_buffer): both sides wait forever. Here, whenever a caller cannot insert,
    diff >= max_diff > min_diff, and inserts > min_size_to_sample (so size >=
    min_size_to_sample, as capacity >= min_size_to_sample): a sampler can proceed.
    Symmetrically, whenever sampling is blocked, inserting is allowed. So some side can
    always move, whatever the batch sizes.

    samples_per_insert == 0 disables the ratio: only min_size_to_sample applies.
    """

    kind = "ratio"  # the rate_limiter setting's name for it (a class attribute, not a field)

    min_size_to_sample: int = 1
    samples_per_insert: float = 0.0
    error_buffer: float = 0.0

    def __post_init__(self) -> None:
        m, spi, eb = self.min_size_to_sample, self.samples_per_insert, self.error_buffer
        if isinstance(m, bool) or not isinstance(m, numbers.Integral) or m < 1:
            raise ValueError(f"min_size_to_sample must be an integer >= 1, got {m!r}")
        if not isinstance(spi, numbers.Real) or not math.isfinite(spi) or spi < 0:
            raise ValueError(f"samples_per_insert must be finite and >= 0, got {spi!r}")
        if not isinstance(eb, numbers.Real) or not math.isfinite(eb) or eb < 0:
            raise ValueError(f"error_buffer must be finite and >= 0, got {eb!r}")
        if spi > 0 and eb <= 0:
            raise ValueError(
                f"error_buffer must be > 0 when samples_per_insert > 0, got {eb!r}"
                " (a zero-width window would let neither side move)"
            )
        object.__setattr__(self, "min_size_to_sample", int(m))
        object.__setattr__(self, "samples_per_insert", float(spi))
        object.__setattr__(self, "error_buffer", float(eb))

    def _diff(self, inserts: int, samples: int) -> float:
        return inserts * self.samples_per_insert - samples

    def can_insert(self, inserts: int, samples: int) -> bool:
        if self.samples_per_insert == 0:
            return True
        max_diff = self.samples_per_insert * self.min_size_to_sample + self.error_buffer
        return self._diff(inserts, samples) < max_diff

    def can_sample(self, inserts: int, samples: int, size: int) -> bool:
        if size < self.min_size_to_sample:
            return False
        if self.samples_per_insert == 0:
            return True
        min_diff = self.samples_per_insert * self.min_size_to_sample - self.error_buffer
        return self._diff(inserts, samples) > min_diff

    def to_json(self) -> dict:
        return {
            "min_size_to_sample": self.min_size_to_sample,
            "samples_per_insert": self.samples_per_insert,
            "error_buffer": self.error_buffer,
        }


@dataclass(eq=False)  # holds arrays: == would be ambiguous
class SampleResult:
    columns: dict[str, np.ndarray | Packed]  # gathered copies, [batch_size, *column_shape]
    keys: np.ndarray  # int64 [batch_size]
    probabilities: np.ndarray  # float64 [batch_size], P(i) at sampling time
    weights: np.ndarray  # float32 [batch_size], largest is 1
    table_size: int


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
    rate_limiter: RateLimiter
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


def _is_int(x: object) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _check_priorities(priorities: object, n: int, what: str) -> np.ndarray:
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
        _check_name(name, "table name")
        if not _is_int(capacity) or capacity < 1:
            raise ValueError(f"capacity must be an integer >= 1, got {capacity!r}")
        if not isinstance(alpha, numbers.Real) or not math.isfinite(alpha) or alpha < 0:
            raise ValueError(f"alpha must be finite and >= 0, got {alpha!r}")
        if not isinstance(rate_limiter, RateLimiter | QueueLimiter):
            raise ValueError(
                f"rate_limiter must be a RateLimiter or QueueLimiter, got {rate_limiter!r}"
            )
        check_composition(name, sampler, remover, max_times_sampled, rate_limiter.kind)
        if isinstance(rate_limiter, RateLimiter) and capacity < rate_limiter.min_size_to_sample:
            raise ValueError(
                f"capacity {capacity} < min_size_to_sample {rate_limiter.min_size_to_sample}:"
                " the table could never be sampled"
            )
        if not _is_int(max_batch_size) or max_batch_size < 1:
            raise ValueError(f"max_batch_size must be an integer >= 1, got {max_batch_size!r}")
        self.name = name
        self.capacity = int(capacity)
        self.sampler = sampler
        self.remover = remover
        self.max_times_sampled = int(max_times_sampled)
        self.alpha = float(alpha)
        self.rate_limiter = rate_limiter
        self.max_batch_size = int(max_batch_size)
        self._rng = np.random.default_rng(seed)

        self.slot_keys = np.full(self.capacity, -1, dtype=np.int64)
        self.priorities = np.zeros(self.capacity, dtype=np.float64)
        self.tree = SumTree(self.capacity)
        # Samples of the item in each slot: only kept when items leave after some.
        self.times_sampled = (
            np.zeros(self.capacity, dtype=np.int64) if self.max_times_sampled else None
        )
        self._held = 0  # items held, kept only when items can leave (size otherwise)
        # Keys below _oldest and from _newest_end on are not held: where fifo / lifo scans
        # start. Lazily tightened by the scans.
        self._oldest = 0
        self._newest_end = 0
        # A queue's largest insert and sample batches requested so far (see QueueLimiter).
        self._largest_insert = 0
        self._largest_sample = 0
        self.inserts = 0  # also the next key
        self.samples = 0
        self.priority_updates = 0
        self.stale_priority_updates = 0
        self.max_priority = 1.0
        # Priority updates checked and counted but not yet written (stage_priorities); the
        # lock lets another thread (an in-process test reading the table) apply them safely.
        self._staged: list[tuple[np.ndarray, np.ndarray]] = []
        self._applying = threading.Lock()

        self._signature: tuple[ColumnSpec, ...] | None = None
        self._columns: dict[str, np.ndarray | FrameStore] = {}
        self._snapshot: Snapshot | None = None  # being taken: told before every write
        if signature is not None:
            self._declare(self._check_signature(signature))

    # --- signature and storage -------------------------------------------------------

    @staticmethod
    def _check_signature(signature: list[ColumnSpec]) -> tuple[ColumnSpec, ...]:
        specs = tuple(signature)
        if not specs:
            raise ValueError("signature must have at least one column (or be None)")
        if not all(isinstance(s, ColumnSpec) for s in specs):
            raise ValueError("signature must be a list of ColumnSpec")
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise ValueError(f"signature has duplicate column names: {names}")
        return specs

    def _declare(self, specs: tuple[ColumnSpec, ...]) -> None:
        # np.zeros maps pages lazily: resident memory grows as slots are first written. A
        # compressed column's memory follows the frames stored (replay/frames.py), at most
        # capacity x the largest frame the codec can declare for the item size.
        columns = {
            s.name: FrameStore(self.capacity)
            if s.codec
            else np.zeros((self.capacity, *s.shape), dtype=s.dtype)
            for s in specs
        }
        self._columns = columns  # assigned only once every allocation succeeded
        self._signature = specs

    @property
    def signature(self) -> tuple[ColumnSpec, ...] | None:
        return self._signature

    @property
    def columns(self) -> Mapping[str, np.ndarray | FrameStore]:
        """The storage arrays, [capacity, *shape] each; rows >= size are zeros."""
        return self._columns

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
        return self.max_times_sampled > 0 or self.sampler in ("fifo", "lifo")

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
        objects), and per item its key, priority and sum-tree leaf (tree nodes are 2 x leaves)."""
        per_item = 8 + 8 + 2 * 8
        for s in self._signature or ():
            per_item += PACKED_ITEM_OVERHEAD if s.codec else s.item_nbytes
        frames = sum(c.nbytes for c in self._columns.values() if isinstance(c, FrameStore))
        return self.size * per_item + frames

    @property
    def _item_limit(self) -> int:
        return min(self.capacity, self.max_batch_size)

    # --- insert ------------------------------------------------------------------------

    def validate_insert(
        self, columns: Mapping[str, np.ndarray], priorities: np.ndarray | None
    ) -> int:
        """Checks an insert without changing anything; returns its number of items."""
        if not isinstance(columns, Mapping) or not columns:
            raise InvalidArgument("batch.columns", "a batch needs at least one column")
        n = None
        first = None
        for name, array in columns.items():
            f = f'batch.columns["{name}"]'
            try:
                _check_name(name, "column name")
            except ValueError as e:
                raise InvalidArgument(f, str(e)) from None
            if isinstance(array, Packed):
                items = len(array)
            elif not isinstance(array, np.ndarray):
                raise InvalidArgument(f, f"must be an array, got {type(array).__name__}")
            elif array.ndim < 1:
                raise InvalidArgument(f, "must have a leading item dimension, got a scalar")
            else:
                items = array.shape[0]
            if n is None:
                n, first = items, name
            elif items != n:
                raise InvalidArgument(f, f"has {items} items but column {first!r} has {n}")
        if self._signature is None:
            for name, array in columns.items():
                if isinstance(array, Packed):
                    self._check_frames(f'batch.columns["{name}"]', array)
                elif array.dtype not in ALLOWED_DTYPES:
                    raise InvalidArgument(
                        f'batch.columns["{name}"]', f"unsupported dtype {array.dtype}"
                    )
        else:
            expected = {s.name: s for s in self._signature}
            for name in expected:
                if name not in columns:
                    raise InvalidArgument(f'batch.columns["{name}"]', "missing from the batch")
            for name, array in columns.items():
                f = f'batch.columns["{name}"]'
                spec = expected.get(name)
                if spec is None:
                    raise InvalidArgument(f, f"not in the signature of table {self.name!r}")
                if spec.codec is not None or isinstance(array, Packed):
                    self._check_packed(f, spec, array)
                    continue
                if array.dtype != spec.dtype:
                    raise InvalidArgument(f, f"dtype must be {spec.dtype}, got {array.dtype}")
                if array.shape[1:] != spec.shape:
                    raise InvalidArgument(
                        f,
                        f"item shape must be {list(spec.shape)}, got {list(array.shape[1:])}"
                        f" (tensor shape {list(array.shape)})",
                    )
                if spec.bounds is not None and array.size:
                    low, high = spec.bounds
                    if not ((array >= low) & (array <= high)).all():  # NaN is outside too
                        raise InvalidArgument(
                            f,
                            f"values must lie in [{low:g}, {high:g}], got some in"
                            f" [{np.nanmin(array):g}, {np.nanmax(array):g}] or NaN",
                        )
        if n == 0:
            raise InvalidArgument("batch", "empty batch (0 items)")
        if n > self._item_limit:
            raise InvalidArgument(
                "batch",
                f"{n} items exceed min(capacity {self.capacity},"
                f" max_batch_size {self.max_batch_size})",
            )
        if priorities is not None:
            _check_priorities(priorities, n, "one per item")
        if self.rate_limiter.kind == "queue":
            self._check_queue_pair("batch", n, self._largest_sample)
            self._largest_insert = max(self._largest_insert, n)
        return n

    def _check_queue_pair(self, field: str, batch: int, other: int) -> None:
        """A queue refuses a batch that could wait forever with one of the other side's: an
        insert of n waits while size > capacity - n, a sample of B while size < B."""
        if batch + other > self.capacity + 1:
            side = "sample" if field == "batch" else "insert"
            raise FailedPrecondition(
                field,
                f"table {self.name!r} is a queue of capacity {self.capacity}: {batch} items with"
                f" the {side} batches of {other} requested before could wait for each other"
                f" forever (an insert batch plus a sample batch must be <= capacity + 1 ="
                f" {self.capacity + 1})",
            )

    def has_room(self, n: int) -> bool:
        """Whether the next n keys' slots are free, or may be overwritten (remover fifo)."""
        if self.remover == "fifo":
            return True
        slots = (self.inserts + np.arange(n)) % self.capacity
        return bool((self.slot_keys[slots] < 0).all())

    @staticmethod
    def _check_frames(field: str, packed: Packed) -> None:
        """Cheap checks of compressed items: the codec, and each frame's declared size."""
        if packed.codec not in codec.CODECS:
            raise InvalidArgument(field, f"codec {packed.codec!r} is not one of {codec.CODECS}")
        if np.dtype(packed.dtype) not in ALLOWED_DTYPES:
            raise InvalidArgument(field, f"unsupported dtype {packed.dtype}")
        bad = codec.check(packed.items(), packed.item_nbytes)
        if bad is not None:
            raise InvalidArgument(field, f"item {bad[0]} {bad[1]}")

    def _check_packed(self, field: str, spec: ColumnSpec, array) -> None:
        if spec.codec is None:
            raise InvalidArgument(field, "is compressed but the column is not")
        if not isinstance(array, Packed):
            raise InvalidArgument(field, f"must be compressed with {spec.codec}")
        if array.codec != spec.codec:
            raise InvalidArgument(field, f"codec must be {spec.codec}, got {array.codec}")
        if np.dtype(array.dtype) != spec.dtype or tuple(array.item_shape) != spec.shape:
            raise InvalidArgument(
                field,
                f"items must be {spec.dtype} {list(spec.shape)},"
                f" got {np.dtype(array.dtype)} {list(array.item_shape)}",
            )
        self._check_frames(field, array)

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
        if self._signature is None:
            self._declare(
                tuple(
                    ColumnSpec(k, v.dtype, v.item_shape, codec=v.codec)
                    if isinstance(v, Packed)
                    else ColumnSpec(k, v.dtype, v.shape[1:])
                    for k, v in columns.items()
                )
            )
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
        # Contiguous slice copies (at most two, n <= capacity): rows can be tens of KB,
        # where fancy indexing would be far slower.
        for name, array in columns.items():
            column = self._columns[name]
            if isinstance(column, FrameStore):
                column.put(start, head, array)
                continue
            column[start : start + head] = array[:head]
            column[: n - head] = array[head:]
        keys = np.arange(first, first + n, dtype=np.int64)
        if self.times_sampled is not None:
            self._held += int(np.count_nonzero(self.slot_keys[keys % self.capacity] < 0))
            self.times_sampled[start : start + head] = 0
            self.times_sampled[: n - head] = 0
        self.slot_keys[start : start + head] = keys[:head]
        self.slot_keys[: n - head] = keys[head:]
        self.priorities[start : start + head] = p[:head]
        self.priorities[: n - head] = p[head:]
        self.tree.set(keys % self.capacity, p**self.alpha)  # 0**0 == 1: alpha 0 is uniform

        self.inserts += n
        self._newest_end = self.inserts
        self._oldest = max(self._oldest, self.inserts - self.capacity)
        self.max_priority = max(self.max_priority, float(p.max()))
        return first

    # --- sample ------------------------------------------------------------------------

    def validate_sample(self, batch_size: int, beta: float) -> None:
        if not _is_int(batch_size) or not 1 <= batch_size <= self._item_limit:
            raise InvalidArgument(
                "batch_size",
                f"must be an integer in [1, {self._item_limit}] (min of capacity"
                f" {self.capacity} and max_batch_size {self.max_batch_size}), got {batch_size!r}",
            )
        # The comparison is False for NaN, so NaN is rejected too.
        if not isinstance(beta, numbers.Real) or not 0.0 <= beta <= 1.0:
            raise InvalidArgument("beta", f"must be in [0, 1], got {beta!r}")
        if self.rate_limiter.kind == "queue":
            self._check_queue_pair("batch_size", int(batch_size), self._largest_insert)
            self._largest_sample = max(self._largest_sample, int(batch_size))

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
        if self.sampler == "prioritized":
            slots, probabilities, weights = self._prioritized(b, beta)
        else:
            if self.sampler == "uniform":
                slots = uniform_slots(self._rng, self.slot_keys, self.used, size, b, self.distinct)
                probabilities = np.full(b, 1.0 / size)
            else:
                slots = self._scan(b, newest=self.sampler == "lifo") % self.capacity
                probabilities = np.ones(b)
            weights = np.ones(b, dtype=np.float32)

        result = SampleResult(
            columns={s.name: self._gather(s, slots) for s in self._signature},
            keys=self.slot_keys[slots],
            probabilities=probabilities,
            weights=weights,
            table_size=size,
        )
        self.samples += b
        if self.max_times_sampled:
            self._count_samples(slots)
        return result

    def _prioritized(self, b: int, beta: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        total = self.tree.total
        if not total > 0:
            raise FailedPrecondition("table", f"table {self.name!r}: every priority is 0")
        # Item b comes from the b-th of B equal segments of the mass (samplers.py).
        if self.distinct:
            slots = distinct_prioritized_slots(self._rng, self.tree, b, self.name)
        else:
            slots = stratified_slots(self._rng, self.tree, b)
        probabilities = self.tree.get(slots) / total
        # w_i = (N P_i)^-beta / max_j (N P_j)^-beta = (min_j P_j / P_i)^beta: N cancels,
        # and this form cannot overflow for tiny P; the largest weight is exactly 1.
        weights = (probabilities.min() / probabilities) ** float(beta)
        return slots, probabilities, weights.astype(np.float32)

    def _scan(self, count: int, newest: bool) -> np.ndarray:
        """The `count` oldest (newest) held keys, oldest (newest) first; tightens the cursor."""
        found = held_keys(self.slot_keys, self._oldest, self._newest_end, count, newest)
        if newest:
            self._newest_end = int(found[0]) + 1
        else:
            self._oldest = int(found[0])
        return found

    def _count_samples(self, slots: np.ndarray) -> None:
        """One more sample for each (distinct) slot; the items at max_times_sampled leave."""
        if self._snapshot is not None:
            self._snapshot.before_slots_write(slots)
        self.times_sampled[slots] += 1
        done = slots[self.times_sampled[slots] >= self.max_times_sampled]
        if len(done):
            self.slot_keys[done] = -1
            self.priorities[done] = 0.0
            self.times_sampled[done] = 0
            self.tree.set(done, np.zeros(len(done)))
            self._held -= len(done)

    def _gather(self, spec: ColumnSpec, slots: np.ndarray) -> np.ndarray | Packed:
        column = self._columns[spec.name]
        if isinstance(column, FrameStore):
            return column.gather(slots, spec.codec, spec.dtype, spec.shape)
        return np.take(column, slots, axis=0)

    # --- priorities --------------------------------------------------------------------

    def _validate_update(self, keys: np.ndarray, priorities: np.ndarray) -> np.ndarray:
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
        return _check_priorities(priorities, n, "one per key")

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
        p = self._validate_update(keys, priorities)
        # Keys >= inserts were never written, so they are stale; clipping to inserts
        # keeps them stale and brings huge uint64 keys into int64 range.
        k = np.minimum(keys, self.inserts).astype(np.int64, copy=False)
        slots = k % self.capacity
        live = self.slot_keys[slots] == k
        updated = int(np.count_nonzero(live))
        if updated:
            if updated < len(k):
                slots, p = slots[live], p[live]
            with self._applying:
                self._staged.append((slots, p))
        self.priority_updates += updated
        self.stale_priority_updates += len(k) - updated
        return updated, len(k) - updated

    def apply_priorities(self) -> None:
        """Writes the staged priority updates, in the order they came (the last one for a slot
        wins). No insert or removal comes between staging and this: those apply first."""
        with self._applying:  # a thread finds the writes of another one complete
            staged, self._staged = self._staged, []
            if not staged:
                return
            slots = np.concatenate([s for s, _ in staged]) if len(staged) > 1 else staged[0][0]
            p = np.concatenate([p for _, p in staged]) if len(staged) > 1 else staged[0][1]
            unique_slots, last = last_occurrence(slots)
            new = p[last]
            if self._snapshot is not None:
                self._snapshot.before_priority_write(unique_slots)
            self.priorities[unique_slots] = new
            self.tree.set(unique_slots, new**self.alpha, distinct=True)
            self.max_priority = max(self.max_priority, float(new.max()))

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
            "signature": None
            if self._signature is None
            else [s.to_json() for s in self._signature],
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
        arrays = [self.slot_keys, self.priorities, *self._columns.values()]
        if self.times_sampled is not None:
            arrays.append(self.times_sampled)
        for array in arrays:
            if isinstance(array, FrameStore):  # each frame's size, then the frames
                h.update(array.sizes[:used])
                for span in array.spans(used):
                    h.update(span)
            else:
                h.update(np.ascontiguousarray(array[:used]))
        # The tree is derived from priorities, but a bug there would change sampling.
        h.update(self.tree.values)
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
        self._check_state(state)
        self._staged = []  # updates of the contents being replaced
        if self._snapshot is not None:  # one in progress keeps the contents it began with
            self._snapshot.finish()
        size, old_size = state.used, self.used
        if state.signature is not None and self._signature is None:
            self._declare(tuple(state.signature))
        for name, column in self._columns.items():
            if isinstance(column, FrameStore):
                column.restore(state.columns[name] if size else EMPTY_ROWS, old_size)
                continue
            if size:  # a state without items may have no signature and no columns
                column[:size] = state.columns[name]
            # Only rows this table wrote: zeroing the rest would touch every page.
            column[size:old_size] = 0
        self.slot_keys[:] = state.slot_keys
        self.priorities[:] = state.priorities
        if self.times_sampled is not None:
            self.times_sampled[:] = state.times_sampled
        self._held = state.size
        # Keys below inserts - capacity were overwritten; the scans tighten the rest.
        self._oldest = max(0, int(state.inserts) - self.capacity)
        self._newest_end = int(state.inserts)
        self.tree.reset(np.where(self.slot_keys >= 0, self.priorities**self.alpha, 0.0))
        self.inserts = int(state.inserts)
        self.samples = int(state.samples)
        self.priority_updates = int(state.priority_updates)
        self.stale_priority_updates = int(state.stale_priority_updates)
        self.max_priority = float(state.max_priority)

    def _check_state(self, state: TableState) -> None:
        if state.name != self.name:
            raise ValueError(f"name: state has {state.name!r}, table is {self.name!r}")
        if state.capacity != self.capacity:
            raise ValueError(f"capacity: state has {state.capacity}, table has {self.capacity}")
        if state.alpha != self.alpha:
            raise ValueError(f"alpha: state has {state.alpha}, table has {self.alpha}")
        for setting in ("sampler", "remover", "max_times_sampled"):
            ours, theirs = getattr(self, setting), getattr(state, setting)
            if theirs != ours:
                raise ValueError(
                    f"{setting}: state of table {self.name!r} has {theirs!r}, table has {ours!r}"
                )
        sig = None if state.signature is None else tuple(state.signature)
        if sig is not None and self._signature is not None and sig != self._signature:
            raise ValueError(f"signature: state has {sig}, table has {self._signature}")
        for counter in ("inserts", "samples", "priority_updates", "stale_priority_updates"):
            value = getattr(state, counter)
            if not _is_int(value) or value < 0:
                raise ValueError(f"{counter}: must be an integer >= 0, got {value!r}")
        if not math.isfinite(state.max_priority) or state.max_priority < 0:
            raise ValueError(f"max_priority: must be finite and >= 0, got {state.max_priority}")
        used = state.used
        cap = self.capacity
        arrays = [
            ("slot_keys", state.slot_keys, np.int64),
            ("priorities", state.priorities, np.float64),
        ]
        if self.max_times_sampled:
            arrays.append(("times_sampled", state.times_sampled, np.int64))
        elif state.times_sampled is not None:
            raise ValueError("times_sampled: present, but max_times_sampled is 0")
        for name, array, dtype in arrays:
            if not isinstance(array, np.ndarray) or array.dtype != dtype or array.shape != (cap,):
                raise ValueError(f"{name}: must be {np.dtype(dtype)} [{cap}]")
        # Keys are insertion numbers, so the slots' keys follow from inserts alone: slot s
        # holds the newest key k < inserts with k % capacity == s, or -1 when it was never
        # written or (only with max_times_sampled) its item left.
        slots = np.arange(cap, dtype=np.int64)
        newest = state.inserts - 1 - (state.inserts - 1 - slots) % cap
        expected = np.where(slots < used, newest, -1)
        matches = state.slot_keys == expected
        if self.max_times_sampled:
            matches |= state.slot_keys == -1
        if not matches.all():
            raise ValueError(f"slot_keys: inconsistent with inserts = {state.inserts}")
        empty = state.slot_keys < 0
        p = state.priorities
        if not (np.isfinite(p).all() and (p >= 0).all() and (p[empty] == 0).all()):
            raise ValueError("priorities: must be finite, >= 0, and 0 for empty slots")
        if self.max_times_sampled:
            t = state.times_sampled
            if not (
                (t >= 0).all() and (t < self.max_times_sampled).all() and (t[empty] == 0).all()
            ):
                raise ValueError(
                    f"times_sampled: must be in [0, {self.max_times_sampled}) and 0 for empty slots"
                )
        size = used  # the rows the state's columns hold
        if sig is None:
            # The first insert fixes the signature, so a state without one is empty.
            if state.columns or size:
                raise ValueError("signature: missing, but the state holds items or columns")
        else:
            if set(state.columns) != {s.name for s in sig}:
                raise ValueError(f"columns: {sorted(state.columns)} do not match the signature")
            for s in sig:
                array = state.columns[s.name]
                if s.codec:
                    if not isinstance(array, FrameRows) or len(array) != size:
                        raise ValueError(f'columns["{s.name}"]: must be FrameRows of {size} items')
                    continue
                if array.dtype != s.dtype or array.shape != (size, *s.shape):
                    raise ValueError(
                        f'columns["{s.name}"]: must be {s.dtype} {[size, *s.shape]},'
                        f" got {array.dtype} {list(array.shape)}"
                    )
