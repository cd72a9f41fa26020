"""Durable checkpoints of replay tables, on top of apexrl.common.checkpoint (never pickle).

The file format, durability (temp file, fsync, rename, directory fsync), retention of
the newest `keep` files and the fallback past damaged files are the generic module's;
see its docstring for the bytes. Replay checkpoints are of kind "replay": files
`replay-<12-digit sequence>.ckpt`, temporaries `.replay-*.tmp`. This module maps a list
of TableState to the checkpoint's meta and arrays and back.

meta:

    {
      "tables": [
        {
          "name": <str>, "capacity": <int>, "alpha": <float>, "max_batch_size": <int>,
          "sampler": <str>, "remover": <str>, "max_times_sampled": <int>,
          "rate_limiter": {"min_size_to_sample": <int>, "samples_per_insert": <float>,
                           "error_buffer": <float>}   (the ratio limiter)
                          or {"kind": "queue"},
          "signature": null (not yet fixed) or
                       [{"name": <str>, "dtype": <numpy dtype.str>, "shape": [<int>...]}...],
          "counters": {"inserts": <int>, "samples": <int>, "priority_updates": <int>,
                       "stale_priority_updates": <int>},
          "max_priority": <float>,
          "columns": [<column name>, ...]
        }, ...
      ]
    }

arrays, for the table at index i of meta["tables"] (the index, not the name, so that
no table or column name can make two arrays collide):

    "tables/<i>/slot_keys"              "<i8" [capacity]: key in each slot, -1 = empty
                                        (never written, or its item left)
    "tables/<i>/priorities"             "<f8" [capacity]: raw priority p (not p ** alpha),
                                        0 for an empty slot
    "tables/<i>/times_sampled"          "<i8" [capacity]: samples of the item in each slot,
                                        only when max_times_sampled > 0
    "tables/<i>/columns/<column name>"  [used, *shape], one per name in "columns":
                                        slots 0 .. used - 1, used = min(inserts, capacity)
                                        (the slots ever written; an emptied slot's row is
                                        kept as it was)

A checkpoint written before tables had these settings has no "sampler", "remover" or
"max_times_sampled": it is read as a prioritized table with remover "fifo" and no limit.
Cursors (where the oldest and newest held keys are) are not stored: they follow from
slot_keys.

except for a compressed column (its signature entry has "codec"), whose items' frames are
stored as they came, back to back:

    "tables/<i>/columns/<column name>"  "u1" [total bytes]: the frames of slots 0 .. used - 1
    "tables/<i>/sizes/<column name>"    "<u4" [used]: each frame's length

A checkpoint whose arrays are not exactly these is rejected as CorruptCheckpoint.
"""

import os
from pathlib import Path

import numpy as np

from apexrl.common import checkpoint as generic
from apexrl.common.checkpoint import CorruptCheckpoint
from apexrl.replay.frames import FrameRows
from apexrl.replay.rate_limiters import QueueLimiter, RateLimiter
from apexrl.replay.signature import ColumnSpec
from apexrl.replay.state import TableState

__all__ = [
    "KIND",
    "CorruptCheckpoint",
    "checkpoints",
    "load_newest",
    "read_checkpoint",
    "write_checkpoint",
]

KIND = "replay"


def checkpoints(directory: str | os.PathLike) -> list[tuple[int, Path]]:
    """(sequence, path) of every replay checkpoint in the directory, oldest first."""
    return generic.checkpoints(directory, KIND)


def _encode(states: list[TableState]) -> tuple[dict, dict[str, np.ndarray]]:
    tables, arrays = [], {}
    for i, s in enumerate(states):
        tables.append(
            {
                "name": s.name,
                "capacity": s.capacity,
                "alpha": s.alpha,
                "max_batch_size": s.max_batch_size,
                "sampler": s.sampler,
                "remover": s.remover,
                "max_times_sampled": s.max_times_sampled,
                "rate_limiter": s.rate_limiter.to_json(),
                "signature": None if s.signature is None else [c.to_json() for c in s.signature],
                "counters": {
                    "inserts": s.inserts,
                    "samples": s.samples,
                    "priority_updates": s.priority_updates,
                    "stale_priority_updates": s.stale_priority_updates,
                },
                "max_priority": s.max_priority,
                "columns": list(s.columns),
            }
        )
        arrays[f"tables/{i}/slot_keys"] = s.slot_keys
        arrays[f"tables/{i}/priorities"] = s.priorities
        if s.times_sampled is not None:
            arrays[f"tables/{i}/times_sampled"] = s.times_sampled
        for name, column in s.columns.items():
            if isinstance(column, FrameRows):  # a compressed column's frames
                arrays[f"tables/{i}/sizes/{name}"] = column.sizes
                column = column.data()
            arrays[f"tables/{i}/columns/{name}"] = column
    return {"tables": tables}, arrays


def _decode(meta: dict, arrays: dict[str, np.ndarray]) -> list[TableState]:
    states, expected = [], set()
    for i, t in enumerate(meta["tables"]):
        prefix = f"tables/{i}/"
        names = {k: f"{prefix}columns/{k}" for k in t["columns"]}
        expected.update([f"{prefix}slot_keys", f"{prefix}priorities", *names.values()])
        max_times_sampled = t.get("max_times_sampled", 0)
        if max_times_sampled:
            expected.add(f"{prefix}times_sampled")
        counters = t["counters"]
        signature = t["signature"]
        columns: dict[str, np.ndarray | FrameRows] = {k: arrays[key] for k, key in names.items()}
        for spec in signature or ():
            if spec.get("codec") and spec["name"] in columns:
                sizes = f"{prefix}sizes/{spec['name']}"
                expected.add(sizes)
                columns[spec["name"]] = _frames(arrays[names[spec["name"]]], arrays[sizes])
        states.append(
            TableState(
                name=t["name"],
                capacity=t["capacity"],
                alpha=float(t["alpha"]),
                signature=None
                if signature is None
                else tuple(ColumnSpec.from_json(c) for c in signature),
                rate_limiter=_limiter(t["rate_limiter"]),
                max_batch_size=t["max_batch_size"],
                inserts=counters["inserts"],
                samples=counters["samples"],
                priority_updates=counters["priority_updates"],
                stale_priority_updates=counters["stale_priority_updates"],
                max_priority=float(t["max_priority"]),
                slot_keys=arrays[f"{prefix}slot_keys"],
                priorities=arrays[f"{prefix}priorities"],
                columns=columns,
                sampler=t.get("sampler", "prioritized"),
                remover=t.get("remover", "fifo"),
                max_times_sampled=max_times_sampled,
                times_sampled=arrays[f"{prefix}times_sampled"] if max_times_sampled else None,
            )
        )
    if set(arrays) != expected:
        raise CorruptCheckpoint(
            f"arrays {sorted(set(arrays) - expected)} unexpected, "
            f"{sorted(expected - set(arrays))} missing"
        )
    return states


def _limiter(obj: dict) -> RateLimiter | QueueLimiter:
    if obj.get("kind") == QueueLimiter.kind:
        return QueueLimiter()
    return RateLimiter(**obj)


def _frames(data: np.ndarray, sizes: np.ndarray) -> FrameRows:
    """A compressed column's rows from its stored arrays."""
    if data.dtype != np.uint8 or sizes.dtype != np.uint32 or int(sizes.sum()) != len(data):
        raise CorruptCheckpoint("a compressed column's sizes do not add up to its bytes")
    return FrameRows.from_data(data.tobytes(), sizes)


def write_checkpoint(
    directory: str | os.PathLike, states: list[TableState], keep: int = 2
) -> tuple[Path, int]:
    """Writes the states durably as the next checkpoint; returns (path, size in bytes).

    Then deletes all but the newest `keep` checkpoints. If writing fails (OSError, e.g.
    ENOSPC), the temporary file is removed, older checkpoints are untouched and the error
    propagates. Meant for a worker thread: the states must not change meanwhile (they
    are Table.snapshot() copies).
    """
    meta, arrays = _encode(states)
    return generic.write_checkpoint(directory, KIND, meta, arrays, keep=keep)


def read_checkpoint(path: str | os.PathLike) -> list[TableState]:
    """The table states in one checkpoint file; CorruptCheckpoint naming the file if it is
    damaged."""
    meta, arrays = generic.read_checkpoint(path, KIND)
    try:
        return _decode(meta, arrays)
    except CorruptCheckpoint as err:
        raise CorruptCheckpoint(f"checkpoint {path}: {err}") from None
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        # Only reachable through a header that passed its checksum: a writer bug.
        raise CorruptCheckpoint(f"checkpoint {path}: malformed header: {err!r}") from err


def load_newest(directory: str | os.PathLike) -> tuple[Path, list[TableState]] | None:
    """The newest readable checkpoint in the directory and its states; None if none.

    A damaged checkpoint is skipped with a warning and the next older one tried; an
    error is logged when every one is damaged.
    """
    return generic.newest_readable(directory, KIND, read_checkpoint)
