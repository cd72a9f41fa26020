"""A table's signature: the columns every item has, and the checks an insert's batch must pass.

A signature is a tuple of ColumnSpec, one per column: its name, the dtype and shape of one
item, and optionally the range its values must lie in or the codec its items arrive
compressed with. It is declared in the settings (`parse_signature`: the `signature` string)
or fixed by a table's first insert (`signature_of`). `check_batch` holds an insert's columns
against it and answers InvalidArgument naming the column.
"""

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from apexrl.common import codec
from apexrl.common.codec import CODECS, Packed
from apexrl.common.errors import InvalidArgument

# The dtypes apexrl.v1.DType can carry (all little-endian; '<f4' == '=f4' here).
ALLOWED_DTYPES = frozenset(
    np.dtype(s)
    for s in ("<f2", "<f4", "<f8", "i1", "<i2", "<i4", "<i8", "u1", "<u2", "<u4", "<u8", "?")
)
MAX_NAME_LENGTH = 256


def check_name(name: object, what: str) -> None:
    """ValueError unless `name` is a printable, non-empty string of <= MAX_NAME_LENGTH chars."""
    if not isinstance(name, str) or not name or len(name) > MAX_NAME_LENGTH:
        raise ValueError(f"{what} must be a non-empty string of <= {MAX_NAME_LENGTH} chars")
    if not name.isprintable():
        raise ValueError(f"{what} {name!r} has non-printable characters")


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
        check_name(self.name, "column name")
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
            if self.codec not in CODECS:
                raise ValueError(f"column {self.name!r}: codec {self.codec!r} not in {CODECS}")
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


def check_signature(signature: list[ColumnSpec]) -> tuple[ColumnSpec, ...]:
    """The signature as a tuple; ValueError if it is empty, not ColumnSpecs, or repeats a name."""
    specs = tuple(signature)
    if not specs:
        raise ValueError("signature must have at least one column (or be None)")
    if not all(isinstance(s, ColumnSpec) for s in specs):
        raise ValueError("signature must be a list of ColumnSpec")
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"signature has duplicate column names: {names}")
    return specs


def signature_of(columns: Mapping[str, np.ndarray | Packed]) -> tuple[ColumnSpec, ...]:
    """The signature a first insert fixes: each column's dtype, item shape and codec."""
    return tuple(
        ColumnSpec(k, v.dtype, v.item_shape, codec=v.codec)
        if isinstance(v, Packed)
        else ColumnSpec(k, v.dtype, v.shape[1:])
        for k, v in columns.items()
    )


def parse_signature(text: str) -> list[ColumnSpec] | None:
    """'obs:float32:4,action:int64:,frame:uint8:84x84x4' -> column specs (None when empty).

    A fourth part bounds a column's values: 'action:float32:1:-2..2' refuses actions outside
    [-2, 2] (a misconfigured actor's), or names the codec of a compressed column:
    'observations:uint8:2x4x84x84:zstd' (common/codec.py).
    """
    if not text.strip():
        return None
    specs = []
    for part in text.split(","):
        try:
            name, dtype, dims, *rest = (p.strip() for p in part.split(":"))
            shape = tuple(int(d) for d in dims.split("x")) if dims else ()
            if len(rest) > 1:
                raise ValueError("too many parts")
            codec_name = rest[0] if rest and rest[0] in CODECS else None
            bounds = (
                tuple(float(b) for b in rest[0].split("..")) if rest and not codec_name else None
            )
            if bounds is not None and len(bounds) != 2:
                raise ValueError(f"bounds {rest[0]!r} are not low..high")
            specs.append(ColumnSpec(name, np.dtype(dtype), shape, bounds, codec_name))
        except (ValueError, TypeError) as err:
            raise ValueError(
                f"signature: cannot parse {part!r} as name:dtype:d0xd1[:low..high|:zstd] ({err})"
            ) from err
    return specs


# --- an insert's batch against the signature -------------------------------------------------


def check_batch(
    columns: Mapping[str, np.ndarray | Packed],
    signature: tuple[ColumnSpec, ...] | None,
    table: str,
) -> int:
    """The items in a batch of columns, all of the same length and, if the table has a
    signature, as it says; InvalidArgument naming the column otherwise. Changes nothing."""
    if not isinstance(columns, Mapping) or not columns:
        raise InvalidArgument("batch.columns", "a batch needs at least one column")
    n = _batch_length(columns)
    if signature is None:
        for name, array in columns.items():
            if isinstance(array, Packed):
                _check_frames(f'batch.columns["{name}"]', array)
            elif array.dtype not in ALLOWED_DTYPES:
                raise InvalidArgument(
                    f'batch.columns["{name}"]', f"unsupported dtype {array.dtype}"
                )
        return n
    expected = {s.name: s for s in signature}
    for name in expected:
        if name not in columns:
            raise InvalidArgument(f'batch.columns["{name}"]', "missing from the batch")
    for name, array in columns.items():
        f = f'batch.columns["{name}"]'
        spec = expected.get(name)
        if spec is None:
            raise InvalidArgument(f, f"not in the signature of table {table!r}")
        if spec.codec is not None or isinstance(array, Packed):
            _check_packed(f, spec, array)
        else:
            _check_array(f, spec, array)
    return n


def _batch_length(columns: Mapping[str, np.ndarray | Packed]) -> int:
    """The items of every column (InvalidArgument unless all columns have as many)."""
    n = None
    first = None
    for name, array in columns.items():
        f = f'batch.columns["{name}"]'
        try:
            check_name(name, "column name")
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
    assert n is not None  # check_batch refuses a batch without columns first
    return n


def _check_array(field: str, spec: ColumnSpec, array: np.ndarray) -> None:
    if array.dtype != spec.dtype:
        raise InvalidArgument(field, f"dtype must be {spec.dtype}, got {array.dtype}")
    if array.shape[1:] != spec.shape:
        raise InvalidArgument(
            field,
            f"item shape must be {list(spec.shape)}, got {list(array.shape[1:])}"
            f" (tensor shape {list(array.shape)})",
        )
    if spec.bounds is not None and array.size:
        low, high = spec.bounds
        if not ((array >= low) & (array <= high)).all():  # NaN is outside too
            raise InvalidArgument(
                field,
                f"values must lie in [{low:g}, {high:g}], got some in"
                f" [{np.nanmin(array):g}, {np.nanmax(array):g}] or NaN",
            )


def _check_frames(field: str, packed: Packed) -> None:
    """Cheap checks of compressed items: the codec, and each frame's declared size."""
    if packed.codec not in CODECS:
        raise InvalidArgument(field, f"codec {packed.codec!r} is not one of {CODECS}")
    if np.dtype(packed.dtype) not in ALLOWED_DTYPES:
        raise InvalidArgument(field, f"unsupported dtype {packed.dtype}")
    bad = codec.check(packed.items(), packed.item_nbytes)
    if bad is not None:
        raise InvalidArgument(field, f"item {bad[0]} {bad[1]}")


def _check_packed(field: str, spec: ColumnSpec, array: np.ndarray | Packed) -> None:
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
    _check_frames(field, array)
