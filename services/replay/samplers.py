"""Which items a batch holds: Reverb's item selectors, as small objects over a table's slots.

A sampler is one class with a name (the `sampler` setting's value) and one registry line
(SAMPLERS). Each table makes its own (`SAMPLERS[name](rng)`) and asks it for a batch's slots
(`select`); the table gathers the items and counts the samples. The table holds the keys, the
priorities and the sum tree that every sampler reads; a sampler keeps only what it needs on
top (the fifo and lifo scan cursors), told of inserts and restores.

- "prioritized": P(i) = p_i^alpha / sum p^alpha on the sum tree, stratified;
- "uniform": every held item equally likely, P(i) = 1 / size;
- "balanced": each draw a coin flip between the items marked by a priority >= 1 and the
  others, then uniform within the class (UNREAL's reward-prediction skew: half the sequences
  end in a reward whatever their share of the table);
- "fifo": the oldest held items, oldest first; "lifo": the newest, newest first. fifo and lifo
  are not random: their probabilities are reported as 1 and their weights as 1, and their
  batches always hold distinct items.

A batch holds distinct items too when the table's items leave after max_times_sampled samples
(`table.distinct`); the table checks that it holds enough before it asks.
"""

from typing import ClassVar, Protocol

import numpy as np

from apexrl.common.errors import FailedPrecondition
from apexrl.replay.sumtree import SumTree

# What a sampler returns: slots (int64 [batch]), probabilities (float64 [batch], P(i) at
# sampling time) and importance weights (float32 [batch], the largest 1).
Selection = tuple[np.ndarray, np.ndarray, np.ndarray]


class Items(Protocol):
    """What a sampler reads of its table (replay/table.py)."""

    name: str
    capacity: int
    inserts: int
    slot_keys: np.ndarray  # int64 [capacity]: the key in each slot, -1 = empty

    @property
    def tree(self) -> SumTree: ...  # p^alpha of each slot

    @property
    def priorities(self) -> np.ndarray: ...  # p of each slot (0: empty)

    @property
    def used(self) -> int: ...

    @property
    def size(self) -> int: ...

    @property
    def distinct(self) -> bool: ...


class Sampler:
    """Picks the slots of a batch among the items a table holds (at least one, and at least
    the batch when the batch holds distinct items)."""

    name: ClassVar[str]  # the sampler setting's value
    always_distinct: ClassVar[bool] = False  # whether its batches hold distinct items anyway

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng

    def select(self, table: Items, batch: int, beta: float) -> Selection:
        raise NotImplementedError

    def inserted(self, inserts: int, capacity: int) -> None:
        """The table now holds the items of keys up to inserts - 1."""

    def restored(self, inserts: int, capacity: int) -> None:
        """The table's contents were replaced by a state's of `inserts` inserts."""


class PrioritizedSampler(Sampler):
    """Stratified prioritized replay: item b of a batch of B comes from the b-th of B equal
    segments of the sum tree's mass; importance weights (N P_i)^-beta, normalized to 1."""

    name = "prioritized"

    def select(self, table: Items, batch: int, beta: float) -> Selection:
        tree = table.tree
        total = tree.total
        if not total > 0:
            raise FailedPrecondition("table", f"table {table.name!r}: every priority is 0")
        if table.distinct:
            slots = distinct_prioritized_slots(self.rng, tree, batch, table.name)
        else:
            slots = stratified_slots(self.rng, tree, batch)
        probabilities = tree.get(slots) / total
        # w_i = (N P_i)^-beta / max_j (N P_j)^-beta = (min_j P_j / P_i)^beta: N cancels,
        # and this form cannot overflow for tiny P; the largest weight is exactly 1.
        weights = (probabilities.min() / probabilities) ** float(beta)
        return slots, probabilities, weights.astype(np.float32)


class UniformSampler(Sampler):
    """Every held item equally likely, whatever its priority."""

    name = "uniform"

    def select(self, table: Items, batch: int, beta: float) -> Selection:
        size = table.size
        slots = uniform_slots(self.rng, table.slot_keys, table.used, size, batch, table.distinct)
        return slots, np.full(batch, 1.0 / size), np.ones(batch, dtype=np.float32)


class BalancedSampler(Sampler):
    """Two classes of items told apart by their priority, the inserter's mark: "marked" (p >= 1)
    and the rest. Each item of a batch is marked with probability 1/2, then drawn uniformly
    among its class's items (with replacement unless the batch holds distinct items, then the
    class's shortfall comes from the other); all from one class while the other is empty.
    P(i) = 1/2 / (its class's size), or 1 / size with one class; weights 1 (no correction, as
    UNREAL has none for its skew)."""

    name = "balanced"
    MARK = 1.0

    def select(self, table: Items, batch: int, beta: float) -> Selection:
        used = table.used
        held = table.slot_keys[:used] >= 0
        marked_slots = np.flatnonzero(held & (table.priorities[:used] >= self.MARK))
        other_slots = np.flatnonzero(held & (table.priorities[:used] < self.MARK))
        classes = (marked_slots, other_slots)
        if not len(marked_slots) or not len(other_slots):
            slots = marked_slots if len(marked_slots) else other_slots
            chosen = self.rng.choice(slots, batch, replace=not table.distinct)
            return chosen, np.full(batch, 1.0 / len(slots)), np.ones(batch, dtype=np.float32)
        marked = int(self.rng.binomial(batch, 0.5))
        if table.distinct:  # a class short of its share: the rest from the other
            marked = min(max(marked, batch - len(other_slots)), len(marked_slots))
        counts = (marked, batch - marked)
        chosen_per_class = [
            self.rng.choice(slots, count, replace=not table.distinct)
            for slots, count in zip(classes, counts, strict=True)
        ]
        probabilities = np.concatenate(
            [np.full(count, 0.5 / len(slots)) for slots, count in zip(classes, counts, strict=True)]
        )
        order = self.rng.permutation(batch)
        slots = np.concatenate(chosen_per_class)[order]
        return slots, probabilities[order], np.ones(batch, dtype=np.float32)


class FifoSampler(Sampler):
    """The oldest held items, oldest first."""

    name = "fifo"
    always_distinct = True

    def __init__(self, rng: np.random.Generator) -> None:
        super().__init__(rng)
        self.oldest = 0  # keys below it are not held: where the scan starts, tightened by it

    def select(self, table: Items, batch: int, beta: float) -> Selection:
        keys = held_keys(table.slot_keys, self.oldest, table.inserts, batch, newest=False)
        self.oldest = int(keys[0])
        return keys % table.capacity, np.ones(batch), np.ones(batch, dtype=np.float32)

    def inserted(self, inserts: int, capacity: int) -> None:
        self.oldest = max(self.oldest, inserts - capacity)  # older keys were overwritten

    def restored(self, inserts: int, capacity: int) -> None:
        self.oldest = max(0, inserts - capacity)


class LifoSampler(Sampler):
    """The newest held items, newest first."""

    name = "lifo"
    always_distinct = True

    def __init__(self, rng: np.random.Generator) -> None:
        super().__init__(rng)
        self.newest_end = 0  # keys from it on are not held: where the scan starts

    def select(self, table: Items, batch: int, beta: float) -> Selection:
        oldest = max(0, table.inserts - table.capacity)  # older keys were overwritten
        keys = held_keys(table.slot_keys, oldest, self.newest_end, batch, newest=True)
        self.newest_end = int(keys[0]) + 1
        return keys % table.capacity, np.ones(batch), np.ones(batch, dtype=np.float32)

    def inserted(self, inserts: int, capacity: int) -> None:
        self.newest_end = inserts

    restored = inserted


# The sampler setting's values, each the sampler it names.
SAMPLERS: dict[str, type[Sampler]] = {
    sampler.name: sampler
    for sampler in (PrioritizedSampler, UniformSampler, BalancedSampler, FifoSampler, LifoSampler)
}


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
