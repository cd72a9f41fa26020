"""ParameterStore as a parameter relay publishes into it: the learner's version numbers, with
gaps (a relay pulls the newest), and the learner's lineage. Change sets span the versions
published; a version never published, or of another lineage, gets the whole."""

import numpy as np

from apexrl.common import tensors
from apexrl.common.learner_client import Parameters, apply_changes
from apexrl.common.parameters import ParameterStore
from apexrl.v1 import learner_pb2


def network(rows: list[int], base: np.ndarray) -> dict[str, np.ndarray]:
    table = base.copy()
    table[rows] += 1.0
    return {"table": table, "bias": np.zeros(4, np.float32)}


def answer(store: ParameterStore, version: int, lineage: int) -> learner_pb2.GetParametersResponse:
    head = learner_pb2.GetParametersResponse()
    data = store.serialize(head, version, lineage, accept_changes=True)
    return learner_pb2.GetParametersResponse.FromString(data)


def test_change_sets_span_skipped_versions_and_stop_at_a_lineage_change():
    base = np.zeros((64, 8), np.float32)
    v1, v3, v7 = network([1], base), network([1, 2], base), network([1, 2, 9], base)
    store = ParameterStore()
    lineage = 12345
    for version, arrays in ((1, v1), (3, v3), (7, v7)):
        store.publish(arrays, update_step=version, version=version, lineage=lineage)
    assert (store.version, store.lineage) == (7, lineage)
    for held, arrays, rows in ((3, v3, [9]), (1, v1, [2, 9])):
        got = answer(store, held, lineage)
        assert got.changes_from == held and list(got.rows) == ["table"]
        assert tensors.from_proto(got.rows["table"], "rows").tolist() == rows
        mine = Parameters(held, lineage, 0, arrays, 0.0, 0, 0, "")
        changed = {n: tensors.from_proto(t, n) for n, t in got.parameters.items()}
        rebuilt = apply_changes(mine, got, changed)
        np.testing.assert_array_equal(rebuilt["table"], v7["table"])
    for held, held_lineage in ((2, lineage), (5, lineage), (3, lineage + 1)):
        got = answer(store, held, held_lineage)  # never published here: the whole
        assert got.changes_from == 0 and set(got.parameters) == {"table", "bias"}, held
    # A new lineage passes through, at a lower number too, and nothing spans the change.
    store.publish(v3, update_step=2, version=2, lineage=lineage + 1)
    assert (store.version, store.lineage) == (2, lineage + 1)
    assert answer(store, 1, lineage + 1).changes_from == 0
    assert answer(store, 7, lineage).changes_from == 0
