"""Leases (the epsilon ladder over live actors) and parameter versions."""

import numpy as np
import pytest

from apexrl.common.parameters import ParameterStore
from apexrl.learner.leases import Leases
from apexrl.v1 import learner_pb2


def served(store: ParameterStore, have: int, lineage: int, **options):
    """The store's answer as a caller decodes it."""
    head = learner_pb2.GetParametersResponse()
    return learner_pb2.GetParametersResponse.FromString(
        store.serialize(head, have, lineage, **options)
    )


def test_leases_order_by_arrival_and_expire():
    leases = Leases(seconds=10)
    assert leases.renew("b", now=0) == (0, 1)
    assert leases.renew("a", now=1) == (1, 2)  # later arrival, later place, whatever the id
    assert leases.renew("c", now=2) == (2, 3)
    assert leases.renew("b", now=5) == (0, 3)  # renewing keeps the place
    # "a" and "c" fall silent; after 10 s only b and a newcomer remain: the ladder re-spreads.
    assert leases.renew("b", now=12.5) == (0, 1)
    assert leases.renew("d", now=13) == (1, 2)
    assert leases.renew("a", now=14) == (2, 3)  # a returning actor starts a new lease at the end


def test_parameter_versions_increase_and_current_callers_get_no_payload():
    store = ParameterStore()
    assert store.publish({"w": np.ones(3, np.float32)}, update_step=0) == 1
    assert store.publish({"w": np.full(3, 2, np.float32)}, update_step=10) == 2
    fresh, current = served(store, 1, store.lineage), served(store, 2, store.lineage)
    assert (fresh.version, fresh.update_step, list(fresh.parameters)) == (2, 10, ["w"])
    assert np.frombuffer(fresh.parameters["w"].data, np.float32).tolist() == [2, 2, 2]
    assert current.version == 2 and len(current.parameters) == 0
    assert fresh.lineage == current.lineage == store.lineage > 0


def test_a_reissued_version_of_another_lineage_is_sent():
    """kill -9 after version 7 was served, resume from a checkpoint at version 5: the new process
    publishes its own 6 and 7; a caller holding the lost 7 must get the new weights."""
    lost, resumed = ParameterStore(), ParameterStore()
    lost.publish({"w": np.ones(1, np.float32)}, update_step=70, version=7)
    resumed.publish({"w": np.ones(1, np.float32)}, update_step=50, version=5)
    resumed.publish({"w": np.full(1, 3, np.float32)}, update_step=60)
    resumed.publish({"w": np.full(1, 4, np.float32)}, update_step=70)
    assert lost.lineage != resumed.lineage
    held, current = served(resumed, 7, lost.lineage), served(resumed, 7, resumed.lineage)
    assert held.version == 7 and np.frombuffer(held.parameters["w"].data, np.float32) == 4
    assert current.version == 7 and len(current.parameters) == 0


def test_resumed_version_is_kept():
    store = ParameterStore()
    assert store.publish({"w": np.ones(1, np.float32)}, update_step=500, version=42) == 42
    assert store.publish({"w": np.ones(1, np.float32)}, update_step=510) == 43


def answer(store: ParameterStore, have: int, lineage: int, in_order: bool = True):
    response = served(store, have, lineage, in_order=in_order)
    w = np.frombuffer(response.parameters["w"].data, np.float32) if response.parameters else []
    return response.version, response.update_step, response.newest_version, list(w)


def test_in_order_callers_get_the_next_kept_version_and_skip_only_what_is_gone():
    """history_bytes keeps older versions (12 B each here) besides the newest: in_order
    answers the one after have_version, with its own update step, while it is kept."""
    store = ParameterStore(history_bytes=24)  # two older versions
    for v in range(1, 6):
        store.publish({"w": np.full(3, v, np.float32)}, update_step=10 * v)
    lineage = store.lineage
    assert answer(store, 3, lineage) == (4, 40, 5, [4, 4, 4])
    assert answer(store, 4, lineage) == (5, 50, 5, [5, 5, 5])
    assert answer(store, 5, lineage) == (5, 50, 5, [])  # holds the newest: nothing to send
    # Versions 1 and 2 are gone: a caller holding 1 gets 3, the oldest kept (1 skipped).
    assert answer(store, 1, lineage) == (3, 30, 5, [3, 3, 3])
    # Without in_order, another lineage or none held: the newest, as always.
    assert answer(store, 3, lineage, in_order=False) == (5, 50, 5, [5, 5, 5])
    assert answer(store, 3, lineage + 1) == (5, 50, 5, [5, 5, 5])
    assert answer(store, 0, 0) == (5, 50, 5, [5, 5, 5])


def test_without_history_only_the_newest_is_kept_and_a_resumed_numbering_starts_afresh():
    store = ParameterStore()
    for v in range(1, 4):
        store.publish({"w": np.full(3, v, np.float32)}, update_step=v)
    assert answer(store, 1, store.lineage) == (3, 3, 3, [3, 3, 3])
    kept = ParameterStore(history_bytes=1000)
    for v in (1, 2, 3):
        kept.publish({"w": np.full(3, v, np.float32)}, update_step=v)
    kept.publish({"w": np.full(3, 9, np.float32)}, update_step=20, version=2)  # restored
    assert answer(kept, 1, kept.lineage) == (2, 20, 2, [9, 9, 9])  # not the old 2 or 3


@pytest.mark.parametrize("n", [1, 2, 5, 16])
def test_ladder_in_responses_matches_the_formula(n):
    from apexrl.algorithms.exploration import epsilon_ladder

    values = [epsilon_ladder(i, n) for i in range(n)]
    expected = [0.4] if n == 1 else [0.4 ** (1 + 7 * i / (n - 1)) for i in range(n)]
    np.testing.assert_allclose(values, expected)


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_a_bad_history_is_refused_naming_it(bad):
    import prometheus_client

    from apexrl.config import LearnerConfig
    from apexrl.learner.server import build

    with pytest.raises(ValueError, match="history_mb"):
        build(LearnerConfig(history_mb=bad), prometheus_client.CollectorRegistry())


def versions_of(store: ParameterStore, rng: np.random.Generator, count: int, touched: int):
    """Publishes `count` versions of a 100-row table (`touched` random rows moved each time),
    a dense layer (all of it moves) and a constant; returns each version's arrays."""
    arrays = {"table": rng.standard_normal((100, 8)).astype(np.float32),
              "dense": rng.standard_normal(5).astype(np.float32),
              "constant": np.ones((4, 2), np.float32)}  # fmt: skip
    published = {}
    for _ in range(count):
        arrays = {name: a.copy() for name, a in arrays.items()}
        arrays["table"][rng.choice(100, touched, replace=False)] += 1.0
        arrays["dense"] += 1.0
        published[store.publish(arrays, update_step=0)] = arrays
    return published


def pull(store: ParameterStore, have: int, lineage: int, in_order: bool = False):
    return served(store, have, lineage, in_order=in_order, accept_changes=True)


def test_a_caller_holding_a_recent_version_gets_only_the_rows_that_changed():
    from apexrl.common.learner_client import Parameters, apply_changes
    from apexrl.common.parameters import CHANGE_VERSIONS

    store = ParameterStore()
    published = versions_of(store, np.random.default_rng(0), 30, touched=3)
    newest = published[30]
    whole = served(store, 29, store.lineage)  # without accept_changes: whole, as always
    assert whole.changes_from == 0 and set(whole.parameters) == set(newest)
    for behind in (1, 4, CHANGE_VERSIONS):
        have = 30 - behind
        response = pull(store, have, store.lineage)
        assert response.changes_from == have and response.version == 30
        # The constant is absent, the dense layer whole, the table its moved rows only: every
        # row touched since `have` (the union over the versions between), no other.
        assert set(response.parameters) == {"table", "dense"} and set(response.rows) == {"table"}
        moved = np.flatnonzero((newest["table"] != published[have]["table"]).any(axis=1))
        rows = np.frombuffer(response.rows["table"].data, np.int32)
        assert rows.tolist() == moved.tolist() and 3 <= len(rows) <= 3 * behind < 100
        assert response.ByteSize() < whole.ByteSize()
        held = Parameters(have, store.lineage, 0, published[have], 0.0, 0, 0, "dqn")
        arrays = apply_changes(held, response, {
            name: np.frombuffer(t.data, np.float32).reshape(t.shape)
            for name, t in response.parameters.items()
        })  # fmt: skip
        for name, array in newest.items():
            np.testing.assert_array_equal(arrays[name], array, err_msg=name)
    assert store.change_bytes == 3 * (8 * 4 + 4) + 5 * 4  # one version behind: 3 rows + dense
    assert store.nbytes == (800 + 5 + 8) * 4
    # Whole: too far behind (the changes are not all known), another lineage, none held, or an
    # in_order answer older than the newest.
    for have, lineage in ((29 - CHANGE_VERSIONS, store.lineage), (29, store.lineage + 1), (0, 0)):
        response = pull(store, have, lineage)
        assert response.changes_from == 0 and set(response.parameters) == set(newest)
    history = ParameterStore(history_bytes=10**6)
    versions_of(history, np.random.default_rng(1), 5, touched=3)
    older = pull(history, 2, history.lineage, in_order=True)
    assert (older.version, older.changes_from) == (3, 0) and len(older.parameters) == 3


def test_changes_larger_than_the_whole_are_sent_whole():
    store = ParameterStore()
    versions_of(store, np.random.default_rng(0), 3, touched=95)  # rows + their indices > whole
    response = pull(store, 2, store.lineage)
    assert response.changes_from == 2 and set(response.parameters) == {"table", "dense"}
    assert len(response.rows) == 0 and response.parameters["table"].shape == [100, 8]
    assert store.change_bytes == (800 + 5) * 4
    dense = ParameterStore()
    for v in range(1, 4):
        dense.publish({"w": np.full((6, 2), v, np.float32)}, update_step=v)
    response = pull(dense, 2, dense.lineage)  # everything moved: the plain answer
    assert response.changes_from == 0 and len(response.parameters) == 1
    assert dense.change_bytes == dense.nbytes == 48


def test_a_change_set_over_another_version_than_the_one_held_is_refused():
    from apexrl.common.learner_client import Parameters, apply_changes

    response = learner_pb2.GetParametersResponse(version=5, changes_from=3)
    held = Parameters(4, 1, 0, {"w": np.zeros(2, np.float32)}, 0.0, 0, 0, "dqn")
    with pytest.raises(ValueError, match="changes_from: 3, but the version held is 4"):
        apply_changes(held, response, {})
    with pytest.raises(ValueError, match="version held is none"):
        apply_changes(None, response, {})
