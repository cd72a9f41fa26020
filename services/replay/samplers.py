"""How a table picks, drops and admits items: Reverb's samplers, removers and queue limiter.

A table (replay/table.py) is a composition of plain values, checked together once
(`check_composition`):

- sampler: which items a batch holds.
  "prioritized": P(i) = p_i^alpha / sum p^alpha on the sum tree, stratified (today's table);
  "uniform": every held item equally likely, P(i) = 1 / size;
  "fifo": the oldest held items, oldest first; "lifo": the newest, newest first. fifo and
  lifo are not random: their probabilities are reported as 1 and their weights as 1.
- remover: what an insert does at capacity. "fifo": the item in its slot (the oldest, key -
  capacity) is evicted. "none": the insert waits until its slots are free (a queue).
- max_times_sampled: 0 (unlimited) or k >= 1: an item leaves the table after its k-th
  sample, and a batch holds distinct items (fifo and lifo batches always do).
- rate limiter: "ratio" (replay/table.py RateLimiter, Reverb's SampleToInsertRatio) or
  "queue" (`QueueLimiter`).

Keys stay insertion sequence numbers with slot = key % capacity, so an item that leaves frees
its slot (slot_keys -1, weight 0 in the sum tree) and only the key that maps there can use it
again. With remover "none" an insert waits while any slot of its keys still holds an item:
capacity bounds the span of keys held (newest - oldest + 1), which is exactly "the table is
full" when items leave in key order. Only the fifo sampler removes in key order, so remover
"none" takes sampler "fifo": any other order leaves holes that inserts cannot use, and a
batch could wait forever for items that have no room to arrive.
"""

from dataclasses import dataclass

import numpy as np

from apexrl.common.errors import FailedPrecondition
from apexrl.replay.sumtree import SumTree

SAMPLERS = ("prioritized", "uniform", "fifo", "lifo")
REMOVERS = ("fifo", "none")
RATE_LIMITERS = ("ratio", "queue")


@dataclass(frozen=True)
class QueueLimiter:
    """Reverb's Queue limiter: inserts wait while the table has no room for the whole batch,
    samples until the table holds the whole batch.

    Both conditions are the table's own (remover "none" waits for room, a distinct batch for
    items), so the limiter adds none. What it does add is the promise that no pair of batch
    sizes deadlocks: an insert of n waits while size > capacity - n and a sample of B while
    size < B, so both wait at once only if n + B > capacity + 1. The table refuses a batch that
    would make such a pair with a batch already requested (FAILED_PRECONDITION naming it).
    """

    kind = "queue"

    def can_insert(self, inserts: int, samples: int) -> bool:
        return True

    def can_sample(self, inserts: int, samples: int, size: int) -> bool:
        return size >= 1

    def to_json(self) -> dict:
        return {"kind": self.kind}


def check_composition(
    table: str, sampler: str, remover: str, max_times_sampled: int, rate_limiter: str
) -> None:
    """ValueError naming the table and the setting if these cannot work together."""
    where = f"table {table!r}"
    if sampler not in SAMPLERS:
        raise ValueError(f"{where}: sampler {sampler!r} is not one of {', '.join(SAMPLERS)}")
    if remover not in REMOVERS:
        raise ValueError(f"{where}: remover {remover!r} is not one of {', '.join(REMOVERS)}")
    if rate_limiter not in RATE_LIMITERS:
        raise ValueError(
            f"{where}: rate_limiter {rate_limiter!r} is not one of {', '.join(RATE_LIMITERS)}"
        )
    k = max_times_sampled
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 0:
        raise ValueError(f"{where}: max_times_sampled must be an integer >= 0, got {k!r}")
    if remover == "none" and k == 0:
        raise ValueError(
            f"{where}: remover 'none' with max_times_sampled 0: items would never leave, so the"
            " first full table would hold every insert forever (set max_times_sampled >= 1)"
        )
    if remover == "none" and sampler != "fifo":
        raise ValueError(
            f"{where}: remover 'none' needs sampler 'fifo', got {sampler!r}: slots are key %"
            " capacity, so items sampled out of insertion order leave holes no insert can use"
            " and a batch could wait forever"
        )
    if remover == "none" and rate_limiter != "queue":
        raise ValueError(
            f"{where}: remover 'none' needs rate_limiter 'queue', got {rate_limiter!r}: the"
            " ratio limiter can hold samples while inserts wait for room"
        )
    if rate_limiter == "queue" and remover != "none":
        raise ValueError(
            f"{where}: rate_limiter 'queue' needs remover 'none', got {remover!r}: with"
            " eviction a full queue would drop unread items instead of holding the insert"
        )


def held_keys(slot_keys: np.ndarray, start: int, stop: int, count: int, newest: bool) -> np.ndarray:
    """Up to `count` keys in [start, stop) whose items are still held, oldest first (newest
    first if `newest`), scanning a chunk of keys at a time from the start (stop) end."""
    capacity = len(slot_keys)
    found: list[np.ndarray] = []
    wanted = count
    chunk = max(2 * count, 256)
    lo, hi = start, stop
    while wanted > 0 and lo < hi:
        if newest:
            keys = np.arange(hi - 1, max(lo, hi - chunk) - 1, -1, dtype=np.int64)
            hi -= len(keys)
        else:
            keys = np.arange(lo, min(hi, lo + chunk), dtype=np.int64)
            lo += len(keys)
        held = keys[slot_keys[keys % capacity] == keys][:wanted]
        found.append(held)
        wanted -= len(held)
        chunk *= 2
    return np.concatenate(found) if found else np.empty(0, np.int64)


def uniform_slots(
    rng: np.random.Generator,
    slot_keys: np.ndarray,
    used: int,
    size: int,
    batch: int,
    distinct: bool,
) -> np.ndarray:
    """`batch` held slots, uniformly, with replacement unless `distinct` (then batch <= size)."""
    if size == used:  # no slot emptied: slots 0 .. used - 1 are exactly the held items
        if distinct:
            return rng.choice(used, batch, replace=False)
        return rng.integers(0, used, batch)
    held = np.flatnonzero(slot_keys[:used] >= 0)
    return rng.choice(held, batch, replace=not distinct)


def stratified_slots(rng: np.random.Generator, tree: SumTree, batch: int) -> np.ndarray:
    """Slot b drawn from the b-th of `batch` equal segments of the tree's mass (total > 0)."""
    total = tree.total
    # Clipped below total because (b + u) / B can round up to 1; find() also never lands on a
    # 0 leaf.
    masses = total * (np.arange(batch) + rng.random(batch)) / batch
    np.minimum(masses, np.nextafter(total, 0.0), out=masses)
    return tree.find(masses)


def distinct_prioritized_slots(
    rng: np.random.Generator, tree: SumTree, batch: int, table: str
) -> np.ndarray:
    """`batch` distinct slots in proportion to the tree's leaves, without replacement: a
    stratified draw, then the items drawn twice are drawn again with the chosen ones' leaves
    zeroed, until the batch is full. The tree is left exactly as it was (its nodes are
    recomputed from the restored leaves)."""
    chosen = np.unique(stratified_slots(rng, tree, batch))
    if len(chosen) == batch:
        return chosen
    parts, saved = [chosen], [tree.get(chosen)]
    tree.set(chosen, np.zeros(len(chosen)))
    try:
        missing = batch - len(chosen)
        while missing:
            if not tree.total > 0:
                raise FailedPrecondition(
                    "batch_size",
                    f"table {table!r}: fewer than batch_size {batch} items have a priority > 0"
                    " (a batch holds distinct items here)",
                )
            more = np.unique(stratified_slots(rng, tree, missing))
            parts.append(more)
            saved.append(tree.get(more))
            tree.set(more, np.zeros(len(more)))
            missing -= len(more)
    finally:
        for slots, values in zip(parts, saved, strict=True):
            tree.set(slots, values)
    return np.concatenate(parts)
