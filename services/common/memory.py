"""glibc malloc settings for the services' processes (no-ops where libc is not glibc)."""

import ctypes
import os

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
    """Returns the free pages of malloc's heaps to the OS (malloc_trim): after a burst, such
    as an actor's insert backlog while replay was away, freed memory otherwise stays counted
    in the process's RSS."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
