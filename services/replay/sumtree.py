"""A sum tree over float64 leaves: batched point updates and batched prefix-sum search.

Layout: one float64 array of 2 * L nodes, L = capacity rounded up to a power of two.
Node 1 is the root, node i has children 2i and 2i + 1, leaves are nodes L .. 2L - 1
(leaf j is node L + j). Node 0 is unused. Leaves at or past `capacity` are padding and
stay 0.

Every operation works on a whole batch of indices at once and walks the tree one level
per numpy call, so a batch costs O(log L) numpy calls whatever its size.
"""

import numpy as np

_TINY = np.nextafter(0.0, 1.0)  # smallest positive float64


def last_occurrence(indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unique indices (sorted) and the position in `indices` of each one's last occurrence.

    Fancy assignment `a[idx] = v` with repeated idx does not promise which value wins,
    so callers that need "last one wins" select those positions explicitly.
    """
    indices = np.asarray(indices)
    n = len(indices)
    shift = n.bit_length()  # a position 0 .. n - 1 fits in `shift` bits
    # (index, position) packed into one int64 that sorts as the pair: numpy's plain sort is
    # many times faster than a stable argsort (0.4 ms for 8,192 indices), which remains for
    # short or unusual input. The unsigned view's max also catches negative indices.
    if n > 64 and indices.dtype == np.int64 and indices.view(np.uint64).max() >> (62 - shift) == 0:
        packed = indices << shift
        packed |= np.arange(n, dtype=np.int64)
        packed.sort()
        ordered = packed >> shift
        positions = packed & ((1 << shift) - 1)
    else:
        positions = np.argsort(indices, kind="stable")  # stable: equal indices keep their order
        ordered = indices[positions]
    last_of_run = np.empty(n, dtype=bool)
    np.not_equal(ordered[1:], ordered[:-1], out=last_of_run[:-1])
    last_of_run[-1:] = True
    return ordered[last_of_run], positions[last_of_run]


class SumTree:
    # set() recomputes the levels up to DENSE_PER_INDEX x (indices set) + DENSE_MIN nodes wide
    # whole, and those below them node by node.
    DENSE_PER_INDEX, DENSE_MIN = 4, 2048

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = int(capacity)
        self._leaves = 1 << (self.capacity - 1).bit_length()  # L, a power of two >= capacity
        self._depth = self._leaves.bit_length() - 1  # levels below the root
        self._nodes = np.zeros(2 * self._leaves, dtype=np.float64)
        # pairs[i] = (node 2i, node 2i + 1): both children of node i in one gather.
        self._pairs = self._nodes.reshape(self._leaves, 2)
        # Per level d (the 2^d nodes 2^d .. 2^(d+1) - 1): (left children, right children, the
        # nodes), as views, so that recomputing a whole level is one np.add.
        self._levels = [
            (self._pairs[w : 2 * w, 0], self._pairs[w : 2 * w, 1], self._nodes[w : 2 * w])
            for w in (1 << d for d in range(self._depth))
        ]

    @property
    def values(self) -> np.ndarray:
        """The leaves 0 .. capacity - 1 (a read-only view; use set() to change them)."""
        view = self._nodes[self._leaves : self._leaves + self.capacity]
        view.flags.writeable = False
        return view

    @property
    def total(self) -> float:
        return float(self._nodes[1])

    def get(self, indices: np.ndarray) -> np.ndarray:
        return self._nodes[self._leaves + np.asarray(indices, dtype=np.int64)]

    def set(self, indices: np.ndarray, values: np.ndarray, *, distinct: bool = False) -> None:
        """Sets leaves (last value wins for a repeated index) and recomputes their ancestors.

        distinct=True: the caller promises no index repeats (the table dedupes its updates
        already), which skips finding each index's last value.

        Each ancestor is recomputed as left + right from its children rather than adjusted
        by a delta, so no rounding error accumulates however many updates it sees.
        """
        indices = np.asarray(indices, dtype=np.int64)
        values = np.asarray(values, dtype=np.float64)
        if indices.shape != values.shape or indices.ndim != 1:
            raise ValueError(f"indices {indices.shape} and values {values.shape} must be 1-D alike")
        if len(indices) == 0:
            return
        if indices.view(np.uint64).max() >= self.capacity:  # negative ones too, as unsigned
            raise IndexError(f"leaf index out of range [0, {self.capacity})")
        if not distinct:
            indices, last = last_occurrence(indices)
            values = values[last]
        nodes = indices + self._leaves
        self._nodes[nodes] = values
        # The levels up to `dense` nodes wide are recomputed whole, one np.add each: cheaper
        # than gathering and scattering the changed nodes' parents (a few numpy calls a level
        # however few nodes), so only the wide levels near the leaves go node by node.
        dense = self.DENSE_PER_INDEX * len(nodes) + self.DENSE_MIN
        depth, stop = self._depth, min(self._depth, dense.bit_length())
        while depth > stop:
            # Siblings share a parent, so `nodes` may repeat; the repeats just write the same
            # sum twice, which is cheaper than removing them.
            depth -= 1
            nodes >>= 1
            children = self._pairs.take(nodes, axis=0)  # take: far faster than pairs[nodes]
            self._nodes[nodes] = children[:, 0] + children[:, 1]
        self._recompute_levels(depth)

    def _recompute_levels(self, depth: int) -> None:
        """Recomputes every node above level `depth` (2^depth nodes wide) from its children."""
        for left, right, out in reversed(self._levels[:depth]):
            np.add(left, right, out=out)

    def reset(self, values: np.ndarray) -> None:
        """Replaces all leaves 0 .. capacity - 1 at once and rebuilds the tree in O(L)."""
        values = np.asarray(values, dtype=np.float64)
        if values.shape != (self.capacity,):
            raise ValueError(f"values must have shape ({self.capacity},), got {values.shape}")
        self._nodes[:] = 0.0
        self._nodes[self._leaves : self._leaves + self.capacity] = values
        self._recompute_levels(self._depth)

    def find(self, masses: np.ndarray) -> np.ndarray:
        """For each mass m (1-D), the leaf j where the running sum of leaves first reaches m.

        That is np.searchsorted(np.cumsum(leaves), m) for 0 < m <= total, up to rounding
        at segment boundaries. The walk goes right only if m exceeds the left sum AND the
        right subtree is non-empty, and m is raised to the smallest positive float first
        (so m <= left never leads into an all-zero left subtree). Hence, while the total is
        positive, it only ever enters subtrees of positive mass: a mass that rounding
        pushed past the total lands on the last non-zero leaf, never on an empty slot or
        padding.
        """
        # A fresh array (reduced in place below); m > left implies m - left > 0 in IEEE
        # arithmetic, so masses stay positive all the way down.
        masses = np.maximum(np.asarray(masses, dtype=np.float64).reshape(-1), _TINY)
        nodes = np.ones(masses.shape, dtype=np.int64)
        for _ in range(self._depth):
            children = self._pairs.take(nodes, axis=0)  # (left, right) sums; take is fast
            left = children[:, 0]
            go_right = (masses > left) & (children[:, 1] > 0.0)
            masses -= left * go_right
            nodes += nodes  # plain in-place ops: cheaper than ufunc out=/where= here
            nodes += go_right
        return nodes - self._leaves
