"""Durable checkpoints of named arrays plus JSON metadata: a documented format, never pickle.

Shared by every service that checkpoints (the replay's tables, the learner's network and
optimizer state). A caller supplies a `kind` (a short name such as "replay" or
"learner"), a JSON object `meta` and a flat mapping of arbitrary string names to numpy
arrays; this module owns the file format, durability, retention and damage handling.

Files. A directory holds files named `<kind>-<sequence>.ckpt`, the sequence a 12-digit
zero-padded decimal (1, 2, ...); the highest sequence is the newest. Writers work in
`.<kind>-*.tmp` files in the same directory, fsync them, rename them into place and
fsync the directory, so a `<kind>-*.ckpt` name always denotes a complete, durable file.
One writer per directory and kind; kinds are [A-Za-z0-9_]+ so that they never share
file names (several kinds may share a directory).

File layout (all integers little-endian):

    offset 0        8 bytes   magic b"APEXCKP1"
    offset 8        8 bytes   H, uint64: length of the header
    offset 16       H bytes   header: a UTF-8 JSON object, right-padded with spaces
                              (0x20) so that the body starts at a multiple of 64
    offset 16 + H   32 bytes  sha256 of the H header bytes (padding included)
    offset B = 48 + H         body: the arrays' raw bytes; the file is exactly
                              B + header["body_nbytes"] bytes long

Header:

    {
      "format": "apexrl.checkpoint", "version": 1,
      "kind": <str, as in the file name>,
      "sequence": <int, as in the file name>,
      "created_unix": <float, seconds since the epoch>,
      "body_nbytes": <int>,
      "meta": <JSON object, the caller's, stored verbatim>,
      "arrays": {<name>: <array>, ...}
    }

where <array> is {"dtype": <numpy dtype.str>, "shape": [<int>...], "offset": <int>,
"nbytes": <int>, "sha256": <hex>}: the array's C-order bytes are body[offset : offset +
nbytes] (offset relative to B, a multiple of 64; gaps are zero bytes; arrays follow each
other in the header's order), nbytes = prod(shape) * itemsize, and sha256 is the digest
of those bytes. dtype.str is one of the 12 wire dtypes "<f2" "<f4" "<f8" "|i1" "<i2"
"<i4" "<i8" "|u1" "<u2" "<u4" "<u8" "|b1" (bool: one byte, 0 or 1); writing any other
dtype (big-endian, object, structured, ...) is refused. JSON floats are written with
Python's repr, which round-trips float64 exactly; NaN and infinities are refused.

Reading checks the magic, the header sha256, the format, version and kind, the file
length, every array's descriptor and sha256 and that the gaps are zero bytes (so that no
byte of the file goes unchecked), and raises CorruptCheckpoint, naming the file, on any
mismatch. Array bytes are read straight into freshly allocated arrays of an allowed dtype:
nothing is ever unpickled.

Crash tests: with APEXRL_CHECKPOINT_KILL_AT=N in its environment, a process kills itself
with SIGKILL at the Nth crash point of its checkpoint writes (counted over the process's
life). A crash point lies before every file operation of a write (unlink, create, write,
fsync, close, rename) and after the last one; unset, each costs one comparison.
"""

import errno
import hashlib
import itertools
import json
import logging
import math
import os
import re
import signal
import struct
import tempfile
import time
from collections.abc import Callable, Mapping
from contextlib import suppress
from pathlib import Path
from typing import TypeVar

import numpy as np

log = logging.getLogger(__name__)

MAGIC = b"APEXCKP1"
FORMAT = "apexrl.checkpoint"
VERSION = 1
# The wire dtypes (apexrl.v1.DType; apexrl.replay.signature.ALLOWED_DTYPES), by dtype.str.
DTYPES = frozenset(
    np.dtype(s)
    for s in ("<f2", "<f4", "<f8", "i1", "<i2", "<i4", "<i8", "u1", "<u2", "<u4", "<u8", "?")
)
_DTYPE_BY_STR = {d.str: d for d in DTYPES}
_ALIGN = 64
_PREFIX = struct.Struct("<8sQ")  # magic, header length
_DIGEST_SIZE = 32
_KIND = re.compile(r"[A-Za-z0-9_]{1,64}")
_TMP_SUFFIX = ".tmp"

T = TypeVar("T")

KILL_AT_ENV = "APEXRL_CHECKPOINT_KILL_AT"


def _kill_at(environ: Mapping[str, str]) -> int:
    raw = environ.get(KILL_AT_ENV, "")
    if not raw:
        return 0
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"{KILL_AT_ENV} must be a positive integer, got {raw!r}")
    return int(raw)


_KILL_AT = _kill_at(os.environ)
_crash_points = itertools.count(1)
# Files newest_readable found damaged: a write deletes them before counting the `keep`
# newest, or a damaged newest file would push a readable one out.
_damaged: set[Path] = set()


def _crash_point() -> None:
    """SIGKILLs this process at the crash point APEXRL_CHECKPOINT_KILL_AT names."""
    if _KILL_AT and next(_crash_points) == _KILL_AT:
        os.kill(os.getpid(), signal.SIGKILL)


class CorruptCheckpoint(ValueError):
    """A checkpoint file that is truncated, malformed, fails its checksums or is of
    another kind."""


def _align(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _check_kind(kind: object) -> str:
    if not isinstance(kind, str) or not _KIND.fullmatch(kind):
        raise ValueError(f"kind must match [A-Za-z0-9_]{{1,64}}, got {kind!r}")
    return kind


def checkpoints(directory: str | os.PathLike, kind: str) -> list[tuple[int, Path]]:
    """(sequence, path) of every checkpoint of this kind in the directory, oldest first."""
    name = re.compile(re.escape(_check_kind(kind)) + r"-(\d{12})\.ckpt")
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = []
    for entry in directory.iterdir():
        m = name.fullmatch(entry.name)
        if m and entry.is_file():
            found.append((int(m.group(1)), entry))
    return sorted(found)


# --- writing ---------------------------------------------------------------------------


def _layout(
    kind: str, meta: dict, arrays: Mapping[str, np.ndarray], sequence: int
) -> tuple[bytes, list[tuple[int, np.ndarray]]]:
    """The padded header bytes and the (offset, array) pairs of the body."""
    body: list[tuple[int, np.ndarray]] = []
    descriptors = {}
    end = 0
    for name, array in arrays.items():
        offset = _align(end)
        body.append((offset, array))
        end = offset + array.nbytes
        descriptors[name] = {
            "dtype": array.dtype.str,
            "shape": list(array.shape),
            "offset": offset,
            "nbytes": array.nbytes,
            "sha256": hashlib.sha256(array.data).hexdigest(),  # hashlib releases the GIL
        }
    header = {
        "format": FORMAT,
        "version": VERSION,
        "kind": kind,
        "sequence": sequence,
        "created_unix": time.time(),
        "body_nbytes": end,
        "meta": meta,
        "arrays": descriptors,
    }
    text = json.dumps(header, allow_nan=False).encode()
    fixed = _PREFIX.size + _DIGEST_SIZE
    text += b" " * (_align(fixed + len(text)) - fixed - len(text))
    return text, body


def _checked_arrays(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The arrays, C-contiguous (0-d arrays stay 0-d); ValueError for a disallowed dtype."""
    checked = {}
    for name, array in arrays.items():
        if not isinstance(name, str):
            raise TypeError(f"array names must be strings, got {name!r}")
        array = np.asarray(array)
        if array.dtype not in DTYPES:
            raise ValueError(f"array {name!r}: dtype {array.dtype.str!r} is not a wire dtype")
        if not array.flags.c_contiguous:
            array = array.copy(order="C")
        checked[name] = array
    return checked


def _raw(array: np.ndarray) -> memoryview:
    """The bytes of a C-contiguous array, without copying (writable if the array is).

    Flattened first: memoryview cannot cast 0-d views or shapes with a zero dimension.
    """
    return array.reshape(-1).data.cast("B")


def _fsync_directory(directory: Path) -> None:
    # The rename is durable only once the directory entry is on disk.
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _pieces(header: bytes, body: list[tuple[int, np.ndarray]]) -> list[bytes | memoryview]:
    """A checkpoint's bytes in file order: prefix, header, the header's digest, then each
    array at its aligned offset (zeros between), the arrays' bytes not copied."""
    pieces: list[bytes | memoryview] = [
        _PREFIX.pack(MAGIC, len(header)),
        header,
        hashlib.sha256(header).digest(),
    ]
    position = 0
    for offset, array in body:
        if offset > position:
            pieces.append(b"\0" * (offset - position))
        pieces.append(_raw(array))
        position = offset + array.nbytes
    return pieces


def write_checkpoint(
    directory: str | os.PathLike,
    kind: str,
    meta: dict,
    arrays: Mapping[str, np.ndarray],
    keep: int = 2,
) -> tuple[Path, int]:
    """Writes meta and arrays durably as the next checkpoint of this kind; returns
    (path, size in bytes).

    Then deletes all but the newest `keep` checkpoints of this kind (and those this process
    found damaged). meta must be a JSON object (str keys; no NaN); arrays must have wire
    dtypes (ValueError otherwise, before anything is written). If writing fails (OSError,
    e.g. ENOSPC), the temporary file is removed, older checkpoints are untouched and the
    error propagates. Meant for a worker thread: the arrays must not change meanwhile (pass
    copies).
    """
    _check_kind(kind)
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    if not isinstance(meta, dict):
        raise TypeError(f"meta must be a dict, got {type(meta).__name__}")
    arrays = _checked_arrays(arrays)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tmp_prefix = f".{kind}-"
    # Leftovers of a writer that crashed: they could fill the disk. Single writer only.
    for leftover in directory.glob(f"{tmp_prefix}*{_TMP_SUFFIX}"):
        _crash_point()
        with suppress(FileNotFoundError):
            leftover.unlink()

    existing = checkpoints(directory, kind)
    sequence = existing[-1][0] + 1 if existing else 1
    if sequence >= 10**12:
        raise OSError(errno.EOVERFLOW, f"checkpoint sequence {sequence} exceeds 12 digits")
    path = directory / f"{kind}-{sequence:012d}.ckpt"
    pieces = _pieces(*_layout(kind, meta, arrays, sequence))
    _crash_point()
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=tmp_prefix, suffix=_TMP_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as f:
            for piece in pieces:
                _crash_point()
                f.write(piece)
                f.flush()  # each piece in the file before the next crash point
            _crash_point()
            os.fsync(f.fileno())
            size = f.tell()
            _crash_point()
        _crash_point()
        os.replace(tmp, path)
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _crash_point()
    _fsync_directory(directory)

    found = [p for _, p in checkpoints(directory, kind)]
    kept = [p for p in found if p.resolve() not in _damaged][-keep:]
    for old in found:
        if old in kept:
            continue
        _crash_point()
        try:
            old.unlink()
            _damaged.discard(old.resolve())
        except OSError as err:  # the new checkpoint is safe; pruning can wait
            log.warning("could not delete old checkpoint %s: %s", old, err)
    _crash_point()
    return path, size


# --- reading ---------------------------------------------------------------------------


def _is_count(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _check_gap(f, start: int, stop: int) -> None:
    """The padding between two arrays is zero bytes (it has no checksum of its own)."""
    f.seek(start)
    if stop < start or f.read(stop - start).strip(b"\0"):
        raise CorruptCheckpoint(f"padding bytes [{start}, {stop}) are not zero")


def _read_array(f, desc: dict, body_start: int, body_nbytes: int, what: str) -> np.ndarray:
    dtype_str = desc["dtype"]
    dtype = _DTYPE_BY_STR.get(dtype_str) if isinstance(dtype_str, str) else None
    if dtype is None:
        raise CorruptCheckpoint(f"{what}: dtype {dtype_str!r} is not allowed")
    shape = desc["shape"]
    if not (isinstance(shape, list) and all(_is_count(d) for d in shape)):
        raise CorruptCheckpoint(f"{what}: bad shape {shape!r}")
    offset, nbytes = desc["offset"], desc["nbytes"]
    if nbytes != math.prod(shape) * dtype.itemsize:
        raise CorruptCheckpoint(f"{what}: nbytes {nbytes} does not match shape and dtype")
    if not (_is_count(offset) and offset + nbytes <= body_nbytes):
        raise CorruptCheckpoint(f"{what}: bytes [{offset}, +{nbytes}) outside the body")
    array = np.empty(tuple(shape), dtype=dtype)
    f.seek(body_start + offset)
    # Raw bytes straight into the array: nothing is ever unpickled.
    if f.readinto(_raw(array)) != nbytes:
        raise CorruptCheckpoint(f"{what}: truncated")
    if hashlib.sha256(array.data).hexdigest() != desc["sha256"]:
        raise CorruptCheckpoint(f"{what}: sha256 mismatch")
    return array


def read_checkpoint(path: str | os.PathLike, kind: str) -> tuple[dict, dict[str, np.ndarray]]:
    """(meta, arrays) of one checkpoint file; CorruptCheckpoint naming the file if it is
    damaged or of another kind."""
    _check_kind(kind)
    with open(path, "rb") as f:
        try:
            return _read(f, kind)
        except CorruptCheckpoint as err:
            raise CorruptCheckpoint(f"checkpoint {path}: {err}") from None


def _read(f, kind: str) -> tuple[dict, dict[str, np.ndarray]]:
    file_size = os.fstat(f.fileno()).st_size
    prefix = f.read(_PREFIX.size)
    if len(prefix) < _PREFIX.size:
        raise CorruptCheckpoint(f"truncated: {file_size} bytes")
    magic, header_size = _PREFIX.unpack(prefix)
    if magic != MAGIC:
        raise CorruptCheckpoint(f"bad magic {magic!r}")
    body_start = _PREFIX.size + header_size + _DIGEST_SIZE
    if body_start > file_size:
        raise CorruptCheckpoint(f"truncated: {file_size} bytes, header needs {body_start}")
    header = f.read(header_size)
    if hashlib.sha256(header).digest() != f.read(_DIGEST_SIZE):
        raise CorruptCheckpoint("header sha256 mismatch")
    try:
        head = json.loads(header.decode("utf-8"))
        if head["format"] != FORMAT or head["version"] != VERSION:
            raise CorruptCheckpoint(f"unknown format {head['format']!r} v{head['version']}")
        if head["kind"] != kind:
            raise CorruptCheckpoint(f"kind {head['kind']!r}, expected {kind!r}")
        body_nbytes = head["body_nbytes"]
        if file_size != body_start + body_nbytes:
            raise CorruptCheckpoint(
                f"{file_size} bytes, header says {body_start + body_nbytes} (truncated?)"
            )
        meta = head["meta"]
        if not isinstance(meta, dict):
            raise CorruptCheckpoint(f"meta is a {type(meta).__name__}, not an object")
        arrays, end = {}, 0
        for name, desc in head["arrays"].items():
            _check_gap(f, body_start + end, body_start + desc["offset"])
            arrays[name] = _read_array(f, desc, body_start, body_nbytes, f"array {name!r}")
            end = desc["offset"] + desc["nbytes"]
        _check_gap(f, body_start + end, body_start + body_nbytes)
        return meta, arrays
    except CorruptCheckpoint:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        # Only reachable through a header that passed its checksum: a writer bug.
        raise CorruptCheckpoint(f"malformed header: {err!r}") from err


def newest_readable(
    directory: str | os.PathLike, kind: str, read: Callable[[Path], T]
) -> tuple[Path, T] | None:
    """(path, read(path)) for the newest checkpoint of this kind that `read` accepts.

    A checkpoint for which `read` raises CorruptCheckpoint is skipped with a warning
    naming the file and why, and the next older one tried (this process's next write
    deletes the skipped one rather than a readable one); when every one is rejected,
    an error is logged and None returned. None, silently, when there are none. For
    services that decode (meta, arrays) further: their decoding errors count as damage.
    """
    found = checkpoints(directory, kind)
    for _, path in reversed(found):
        try:
            return path, read(path)
        except CorruptCheckpoint as err:
            log.warning("skipping damaged %s: trying the previous one", err)
            _damaged.add(path.resolve())
    if found:
        log.error("no readable checkpoint among %d in %s", len(found), directory)
    return None


def load_newest(
    directory: str | os.PathLike, kind: str
) -> tuple[Path, dict, dict[str, np.ndarray]] | None:
    """(path, meta, arrays) of the newest readable checkpoint of this kind; None if none.

    Damaged ones are skipped with a warning (see newest_readable).
    """
    found = newest_readable(directory, kind, lambda p: read_checkpoint(p, kind))
    if found is None:
        return None
    path, (meta, arrays) = found
    return path, meta, arrays
