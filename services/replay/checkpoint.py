"""Durable checkpoints of replay tables: a documented binary format, never pickle.

A directory holds files named `replay-<sequence>.ckpt`, the sequence a 12-digit
zero-padded decimal (1, 2, ...); the highest sequence is the newest. Writers work in
`.replay-*.tmp` files in the same directory and rename them into place, so a
`replay-*.ckpt` name always denotes a complete, fsynced file. One writer per directory.

File layout (all integers little-endian):

    offset 0        8 bytes   magic b"APEXRPL1"
    offset 8        8 bytes   H, uint64: length of the header
    offset 16       H bytes   header: a UTF-8 JSON object, right-padded with spaces
                              (0x20) so that the body starts at a multiple of 64
    offset 16 + H   32 bytes  sha256 of the H header bytes (padding included)
    offset B = 48 + H         body: the arrays' raw bytes; the file is exactly
                              B + header["body_nbytes"] bytes long

Header:

    {
      "format": "apexrl.replay.checkpoint", "version": 1,
      "sequence": <int, as in the file name>,
      "created_unix": <float, seconds since the epoch>,
      "body_nbytes": <int>,
      "tables": [
        {
          "name": <str>, "capacity": <int>, "alpha": <float>, "max_batch_size": <int>,
          "rate_limiter": {"min_size_to_sample": <int>, "samples_per_insert": <float>,
                           "error_buffer": <float>},
          "signature": null (not yet fixed) or
                       [{"name": <str>, "dtype": <numpy dtype.str>, "shape": [<int>...]}...],
          "counters": {"inserts": <int>, "samples": <int>, "priority_updates": <int>,
                       "stale_priority_updates": <int>},
          "max_priority": <float>,
          "arrays": {
            "slot_keys":  <array>,   "<i8" [capacity]: key in each slot, -1 = empty
            "priorities": <array>,   "<f8" [capacity]: raw priority p (not p ** alpha)
            "columns": {"<column name>": <array>, ...}
                       [size, *shape]: slots 0 .. size - 1, size = min(inserts, capacity)
          }
        }, ...
      ]
    }

where <array> is {"dtype": <numpy dtype.str>, "shape": [<int>...], "offset": <int>,
"nbytes": <int>, "sha256": <hex>}: the array's C-order bytes are body[offset : offset +
nbytes] (offset relative to B, a multiple of 64; gaps are zero bytes), nbytes =
prod(shape) * itemsize, and sha256 is the digest of those bytes. dtype.str is one of
"<f2" "<f4" "<f8" "|i1" "<i2" "<i4" "<i8" "|u1" "<u2" "<u4" "<u8" "|b1" (bool: one byte,
0 or 1). JSON floats are written with Python's repr, which round-trips float64 exactly.
"""

import errno
import hashlib
import json
import logging
import math
import os
import re
import struct
import tempfile
import time
from contextlib import suppress
from pathlib import Path

import numpy as np

from apexrl.replay.table import ALLOWED_DTYPES, ColumnSpec, RateLimiter, TableState

log = logging.getLogger(__name__)

MAGIC = b"APEXRPL1"
FORMAT = "apexrl.replay.checkpoint"
VERSION = 1
_ALIGN = 64
_PREFIX = struct.Struct("<8sQ")  # magic, header length
_DIGEST_SIZE = 32
_NAME = re.compile(r"replay-(\d{12})\.ckpt")
_TMP_PREFIX, _TMP_SUFFIX = ".replay-", ".tmp"


class CorruptCheckpoint(ValueError):
    """A checkpoint file that is truncated, malformed or fails its checksums."""


def _align(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def checkpoints(directory: str | os.PathLike) -> list[tuple[int, Path]]:
    """(sequence, path) of every checkpoint in the directory, oldest first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = []
    for entry in directory.iterdir():
        m = _NAME.fullmatch(entry.name)
        if m and entry.is_file():
            found.append((int(m.group(1)), entry))
    return sorted(found)


# --- writing ---------------------------------------------------------------------------


def _describe(array: np.ndarray, offset: int) -> dict:
    return {
        "dtype": array.dtype.str,
        "shape": list(array.shape),
        "offset": offset,
        "nbytes": array.nbytes,
        "sha256": hashlib.sha256(array).hexdigest(),  # hashlib releases the GIL
    }


def _layout(states: list[TableState], sequence: int) -> tuple[bytes, list[tuple[int, np.ndarray]]]:
    """The padded header bytes and the (offset, array) pairs of the body."""
    body: list[tuple[int, np.ndarray]] = []
    end = 0

    def place(array: np.ndarray) -> dict:
        nonlocal end
        array = np.ascontiguousarray(array)
        offset = _align(end)
        body.append((offset, array))
        end = offset + array.nbytes
        return _describe(array, offset)

    tables = []
    for s in states:
        tables.append(
            {
                "name": s.name,
                "capacity": s.capacity,
                "alpha": s.alpha,
                "max_batch_size": s.max_batch_size,
                "rate_limiter": s.rate_limiter.to_json(),
                "signature": None if s.signature is None else [c.to_json() for c in s.signature],
                "counters": {
                    "inserts": s.inserts,
                    "samples": s.samples,
                    "priority_updates": s.priority_updates,
                    "stale_priority_updates": s.stale_priority_updates,
                },
                "max_priority": s.max_priority,
                "arrays": {
                    "slot_keys": place(s.slot_keys),
                    "priorities": place(s.priorities),
                    "columns": {name: place(a) for name, a in s.columns.items()},
                },
            }
        )
    header = {
        "format": FORMAT,
        "version": VERSION,
        "sequence": sequence,
        "created_unix": time.time(),
        "body_nbytes": end,
        "tables": tables,
    }
    text = json.dumps(header, allow_nan=False).encode()
    fixed = _PREFIX.size + _DIGEST_SIZE
    text += b" " * (_align(fixed + len(text)) - fixed - len(text))
    return text, body


def _fsync_directory(directory: Path) -> None:
    # The rename is durable only once the directory entry is on disk.
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_checkpoint(
    directory: str | os.PathLike, states: list[TableState], keep: int = 2
) -> tuple[Path, int]:
    """Writes the states durably as the next checkpoint; returns (path, size in bytes).

    Then deletes all but the newest `keep` checkpoints. If writing fails (OSError, e.g.
    ENOSPC), the temporary file is removed, older checkpoints are untouched and the error
    propagates. Meant for a worker thread: the states must not change meanwhile (they
    are Table.snapshot() copies).
    """
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    # Leftovers of a writer that crashed: they could fill the disk. Single writer only.
    for leftover in directory.glob(f"{_TMP_PREFIX}*{_TMP_SUFFIX}"):
        with suppress(FileNotFoundError):
            leftover.unlink()

    existing = checkpoints(directory)
    sequence = existing[-1][0] + 1 if existing else 1
    if sequence >= 10**12:
        raise OSError(errno.EOVERFLOW, f"checkpoint sequence {sequence} exceeds 12 digits")
    path = directory / f"replay-{sequence:012d}.ckpt"
    header, body = _layout(states, sequence)

    fd, tmp = tempfile.mkstemp(dir=directory, prefix=_TMP_PREFIX, suffix=_TMP_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(_PREFIX.pack(MAGIC, len(header)))
            f.write(header)
            f.write(hashlib.sha256(header).digest())
            position = 0
            for offset, array in body:
                f.write(b"\0" * (offset - position))
                f.write(memoryview(array).cast("B"))  # raw bytes, no copy
                position = offset + array.nbytes
            f.flush()
            os.fsync(f.fileno())
            size = f.tell()
        os.replace(tmp, path)
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_directory(directory)

    for _, old in checkpoints(directory)[:-keep]:
        try:
            old.unlink()
        except OSError as err:  # the new checkpoint is safe; pruning can wait
            log.warning("could not delete old checkpoint %s: %s", old, err)
    return path, size


# --- reading ---------------------------------------------------------------------------


def _read_array(f, desc: dict, body_start: int, body_nbytes: int, what: str) -> np.ndarray:
    dtype = np.dtype(desc["dtype"])
    if dtype not in ALLOWED_DTYPES:
        raise CorruptCheckpoint(f"{what}: dtype {desc['dtype']!r} is not allowed")
    shape = tuple(desc["shape"])
    if not all(isinstance(d, int) and d >= 0 for d in shape):
        raise CorruptCheckpoint(f"{what}: bad shape {list(shape)}")
    offset, nbytes = desc["offset"], desc["nbytes"]
    if nbytes != math.prod(shape) * dtype.itemsize:
        raise CorruptCheckpoint(f"{what}: nbytes {nbytes} does not match shape and dtype")
    if not (isinstance(offset, int) and 0 <= offset and offset + nbytes <= body_nbytes):
        raise CorruptCheckpoint(f"{what}: bytes [{offset}, +{nbytes}) outside the body")
    array = np.empty(shape, dtype=dtype)
    f.seek(body_start + offset)
    # Raw bytes straight into the array: nothing is ever unpickled.
    if f.readinto(memoryview(array).cast("B")) != nbytes:
        raise CorruptCheckpoint(f"{what}: truncated")
    if hashlib.sha256(array).hexdigest() != desc["sha256"]:
        raise CorruptCheckpoint(f"{what}: sha256 mismatch")
    return array


def _read_table(f, t: dict, body_start: int, body_nbytes: int) -> TableState:
    name = t["name"]
    arrays = t["arrays"]
    counters = t["counters"]

    def read(desc: dict, what: str) -> np.ndarray:
        return _read_array(f, desc, body_start, body_nbytes, f"table {name!r} {what}")

    signature = t["signature"]
    return TableState(
        name=name,
        capacity=t["capacity"],
        alpha=float(t["alpha"]),
        signature=None if signature is None else tuple(ColumnSpec.from_json(c) for c in signature),
        rate_limiter=RateLimiter(**t["rate_limiter"]),
        max_batch_size=t["max_batch_size"],
        inserts=counters["inserts"],
        samples=counters["samples"],
        priority_updates=counters["priority_updates"],
        stale_priority_updates=counters["stale_priority_updates"],
        max_priority=float(t["max_priority"]),
        slot_keys=read(arrays["slot_keys"], "slot_keys"),
        priorities=read(arrays["priorities"], "priorities"),
        columns={k: read(d, f'columns["{k}"]') for k, d in arrays["columns"].items()},
    )


def read_checkpoint(path: str | os.PathLike) -> list[TableState]:
    """The table states in one checkpoint file; CorruptCheckpoint if it is damaged."""
    with open(path, "rb") as f:
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
            meta = json.loads(header.decode("utf-8"))
            if meta["format"] != FORMAT or meta["version"] != VERSION:
                raise CorruptCheckpoint(f"unknown format {meta['format']!r} v{meta['version']}")
            body_nbytes = meta["body_nbytes"]
            if file_size != body_start + body_nbytes:
                raise CorruptCheckpoint(
                    f"{file_size} bytes, header says {body_start + body_nbytes} (truncated?)"
                )
            return [_read_table(f, t, body_start, body_nbytes) for t in meta["tables"]]
        except CorruptCheckpoint:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            # Only reachable through a header that passed its checksum: a writer bug.
            raise CorruptCheckpoint(f"malformed header: {err!r}") from err


def load_newest(directory: str | os.PathLike) -> tuple[Path, list[TableState]] | None:
    """The newest readable checkpoint in the directory and its states; None if none.

    A damaged checkpoint is skipped with a warning and the next older one tried.
    """
    found = checkpoints(directory)
    for _, path in reversed(found):
        try:
            return path, read_checkpoint(path)
        except CorruptCheckpoint as err:
            log.warning("skipping damaged checkpoint %s: %s", path, err)
    if found:
        log.error("no readable checkpoint among %d in %s", len(found), directory)
    return None
