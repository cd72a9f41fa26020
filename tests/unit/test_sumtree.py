import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apexrl.replay.sumtree import SumTree, last_occurrence

values_st = st.one_of(
    st.just(0.0),
    st.floats(min_value=1e-12, max_value=1e6, allow_nan=False, allow_infinity=False),
)


@st.composite
def set_sequences(draw):
    capacity = draw(st.integers(1, 70))
    ops = []
    for _ in range(draw(st.integers(1, 6))):
        n = draw(st.integers(1, 2 * capacity))
        indices = draw(st.lists(st.integers(0, capacity - 1), min_size=n, max_size=n))
        values = draw(st.lists(values_st, min_size=n, max_size=n))
        ops.append((np.array(indices, np.int64), np.array(values, np.float64)))
    return capacity, ops


def check_consistent(tree: SumTree) -> None:
    """Every internal node is exactly left + right: no drift, padding is zero."""
    nodes, leaves = tree._nodes, tree._leaves
    assert (nodes[leaves + tree.capacity :] == 0).all()
    parents = np.arange(1, leaves)
    np.testing.assert_array_equal(nodes[parents], nodes[2 * parents] + nodes[2 * parents + 1])


@settings(max_examples=150, deadline=None)
@given(set_sequences(), st.integers(0, 2**32 - 1))
def test_matches_brute_force(case, seed):
    capacity, ops = case
    tree = SumTree(capacity)
    ref = np.zeros(capacity)
    for indices, values in ops:
        tree.set(indices, values)
        for i, v in zip(indices, values, strict=True):  # reference: one at a time, last wins
            ref[i] = v
        np.testing.assert_array_equal(tree.values, ref)
        np.testing.assert_array_equal(tree.get(np.arange(capacity)), ref)
        assert tree.total == pytest.approx(ref.sum(), rel=1e-12, abs=0)
        check_consistent(tree)

    if tree.total == 0:
        return
    cumsum = np.cumsum(ref)
    rng = np.random.default_rng(seed)
    # Uniform masses, plus the edges: 0, the total, and just past it (rounding).
    masses = np.concatenate(
        [rng.random(200) * tree.total, [0.0, tree.total, tree.total * (1 + 1e-15)]]
    )
    found = tree.find(masses)
    assert found.dtype == np.int64
    assert ((found >= 0) & (found < capacity)).all()
    assert (ref[found] > 0).all(), "find returned an empty leaf"
    expected = np.minimum(np.searchsorted(cumsum, masses), capacity - 1)
    # Equal to the prefix-sum search except where m sits on a segment boundary, where
    # the two summation orders may round differently.
    differ = found != expected
    near_boundary = np.abs(masses[:, None] - cumsum[None, :]).min(axis=1) <= 1e-9 * tree.total
    assert not (differ & ~near_boundary & (masses > 0) & (masses <= cumsum[-1])).any()


def test_find_never_lands_on_zero_padding_or_empty_slots():
    tree = SumTree(5)  # L = 8: leaves 5..7 are padding
    tree.set(np.array([0, 1, 2, 3, 4]), np.array([0.0, 0.1, 0.2, 0.0, 0.0]))
    masses = np.array([0.0, 1e-300, 0.1, 0.1 + 1e-17, 0.3, 0.30000000000000004, 1.0, 1e300])
    found = tree.find(masses)
    assert set(found.tolist()) <= {1, 2}
    assert found[0] == 1 and found[-1] == 2


def test_duplicate_indices_last_value_wins():
    tree = SumTree(4)
    tree.set(np.array([2, 1, 2, 2, 1]), np.array([1.0, 2.0, 3.0, 4.0, 5.0]))
    np.testing.assert_array_equal(tree.values, [0.0, 5.0, 4.0, 0.0])
    assert tree.total == 9.0
    index, position = last_occurrence(np.array([3, 3, 1, 3]))
    np.testing.assert_array_equal(index, [1, 3])
    np.testing.assert_array_equal(position, [2, 3])


def test_reset_equals_set():
    rng = np.random.default_rng(1)
    values = rng.random(1000) * (rng.random(1000) > 0.3)
    a, b = SumTree(1000), SumTree(1000)
    a.set(np.arange(1000), values)
    b.set(np.array([3]), np.array([7.0]))
    b.reset(values)
    np.testing.assert_array_equal(a._nodes, b._nodes)
    check_consistent(b)


def test_capacity_one_and_bad_arguments():
    tree = SumTree(1)
    tree.set(np.array([0]), np.array([2.5]))
    assert tree.total == 2.5
    np.testing.assert_array_equal(tree.find(np.array([0.0, 1.0, 2.5, 9.0])), [0, 0, 0, 0])
    with pytest.raises(ValueError):
        SumTree(0)
    with pytest.raises(IndexError):
        tree.set(np.array([1]), np.array([1.0]))
    with pytest.raises(ValueError):
        tree.set(np.array([0, 0]), np.array([1.0]))
    with pytest.raises(ValueError):
        tree.values[0] = 1.0  # read-only view


def test_no_drift_after_many_updates():
    rng = np.random.default_rng(2)
    tree = SumTree(1 << 12)
    for _ in range(300):
        tree.set(rng.integers(0, 1 << 12, 64), rng.random(64) * 1e3)
    tree.set(np.arange(1 << 12), np.zeros(1 << 12))
    assert tree.total == 0.0  # exact: sums are recomputed, never adjusted by deltas
