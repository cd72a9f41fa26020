"""Memory the services' processes give back: glibc malloc settings (no-ops where libc is not
glibc), and copies of batches in memory of their own."""

import ctypes
import dataclasses
import gc
import mmap
import os
from collections.abc import Mapping

import numpy as np

from apexrl.common import codec
from apexrl.common.codec import Packed

M_ARENA_MAX = -8  # malloc.h


def _glibc():
    try:
        libc = ctypes.CDLL(None)
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


def limit_malloc_arenas(arenas: int = 2) -> None:
    """glibc gives each new thread a malloc arena of its own (up to 8 per core), each heap
    growing to its own high-water mark: a learner's dozen gRPC, prefetch and write-back
    threads made its RSS climb for its first 20 minutes (benchmarks/soak.py's resource check
    failed on it). Two arenas, as MALLOC_ARENA_MAX=2 would set, unless the user set that.
    Call before the process starts threads."""
    libc = _glibc()
    if libc is not None and "MALLOC_ARENA_MAX" not in os.environ:
        libc.mallopt(M_ARENA_MAX, arenas)


def release_free_memory() -> None:
    """Frees what only reference cycles still hold, then returns the free pages of malloc's
    heaps to the OS (malloc_trim): after a burst, such as an actor's insert backlog while
    replay was away, freed memory otherwise stays counted in the process's RSS. The cycles
    first: a failed call's exception holds its traceback's frames and their locals (the
    batch it carried among them) until a full collection, which a process that allocates
    few objects may not run for hours (after a 29 s partition an actor kept 3 held batches
    mapped and 1.7 MB of heap that malloc_trim alone could not return)."""
    gc.collect()
    trim_heaps()


def trim_heaps() -> None:
    """Returns the free pages of every malloc arena to the OS (malloc_trim(0))."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


def off_heap(columns: Mapping[str, np.ndarray | Packed], priorities: np.ndarray):
    """A copy of an insert batch (its columns and priorities) in one anonymous memory map of its
    own, unmapped when the last of them is freed. Batches an actor holds while replay is away
    otherwise lie in malloc's heap between whatever else the process allocates meanwhile, and
    a heap returns no page that one live object still touches: after a 25 s partition an
    actor's heap stayed 5 MB larger, 1,346 free holes of 3.8 KB on average (malloc_info)."""
    # Each array at a 16-byte boundary (numpy's alignment): at most 2 arrays a column, + 1.
    block = mmap.mmap(-1, codec.nbytes(columns) + priorities.nbytes + 16 * (2 * len(columns) + 1))
    offset = 0

    def copy(a: np.ndarray) -> np.ndarray:
        nonlocal offset
        out = np.frombuffer(block, a.dtype, a.size, offset).reshape(a.shape)
        out[...] = a
        offset += -(-a.nbytes // 16) * 16
        return out

    out = {
        key: dataclasses.replace(
            value, sizes=copy(value.sizes), data=copy(np.frombuffer(value.data, np.uint8)).data
        )
        if isinstance(value, Packed)
        else copy(value)
        for key, value in columns.items()
    }
    return out, copy(priorities)
