"""GetParameters from bytes encoded once per version: what the learner sends is what it sent
when it built every response field by field (the reference below), and a client decodes the
same arrays, bit for bit, from the Atari network's 6.75 MB."""

import grpc
import numpy as np
import pytest

from apexrl.common import tensors
from apexrl.common.learner_client import LearnerClient
from apexrl.common.parameters import ParameterStore
from apexrl.config import LearnerConfig
from apexrl.v1 import learner_pb2, learner_pb2_grpc
from tests.conftest import serve_learner

ENV = "ALE/Pong-v5"


def field_by_field(head, version, update_step, newest, lineage, arrays, changes_from=0, rows=None):
    """A response as the learner built one before: each tensor encoded into it per call."""
    response = learner_pb2.GetParametersResponse()
    response.CopyFrom(head)
    response.version, response.update_step = version, update_step
    response.newest_version, response.lineage = newest, lineage
    response.changes_from = changes_from
    for name, array in arrays.items():
        response.parameters[name].CopyFrom(tensors.to_proto(array))
    for name, indices in (rows or {}).items():
        response.rows[name].CopyFrom(tensors.to_proto(indices))
    return response


def copy(head: learner_pb2.GetParametersResponse) -> learner_pb2.GetParametersResponse:
    return learner_pb2.GetParametersResponse.FromString(head.SerializeToString())


def assert_same_message(sent: bytes, reference: learner_pb2.GetParametersResponse) -> None:
    decoded = learner_pb2.GetParametersResponse.FromString(sent)
    assert decoded == reference
    assert decoded.SerializeToString(deterministic=True) == reference.SerializeToString(
        deterministic=True
    )
    for name, tensor in reference.parameters.items():  # each tensor's wire bytes, one by one
        assert decoded.parameters[name].SerializeToString() == tensor.SerializeToString(), name


@pytest.fixture(scope="module")
def atari_arrays() -> dict[str, np.ndarray]:
    from apexrl import algorithms
    from apexrl.algorithms.networks import state_to_numpy

    return state_to_numpy(algorithms.make(LearnerConfig(env=ENV)).network())


def test_the_bytes_sent_are_the_field_by_field_response_and_encoded_once(atari_arrays, monkeypatch):
    arrays = atari_arrays
    assert sum(a.nbytes for a in arrays.values()) > 6_000_000  # the Atari network
    store = ParameterStore()
    store.publish(arrays, update_step=10)
    second = dict(arrays)
    moved = next(name for name, a in arrays.items() if a.ndim == 2 and len(a) > 4)
    second[moved] = arrays[moved].copy()
    second[moved][[1, 3]] += 1.0  # two rows move: a change set of those rows
    store.publish(second, update_step=20)
    head = learner_pb2.GetParametersResponse(
        lease_seconds=10.0,
        algorithm="dqn",
        actor_index=3,
        num_actors=8,
        exploration=0.25,
        epsilon=0.25,
    )
    rows = np.array([1, 3], np.int32)
    references = {
        "whole": field_by_field(head, 2, 20, 2, store.lineage, second),
        "changes": field_by_field(
            head,
            2,
            20,
            2,
            store.lineage,
            {moved: second[moved][rows]},
            changes_from=1,
            rows={moved: rows},
        ),
        "current": field_by_field(head, 2, 20, 2, store.lineage, {}),
    }
    sent = {"whole": [], "changes": [], "current": []}
    with monkeypatch.context() as patch:  # no tensor is encoded once the versions are published
        patch.setattr(tensors, "to_proto", lambda *_: pytest.fail("a tensor encoded again"))
        for _ in range(3):
            sent["whole"].append(store.serialize(copy(head), 0, 0))
            sent["changes"].append(
                store.serialize(copy(head), 1, store.lineage, accept_changes=True)
            )
            sent["current"].append(store.serialize(copy(head), 2, store.lineage))
    for kind, answers in sent.items():
        for answer in answers:
            assert_same_message(answer, references[kind])


def test_a_client_decodes_the_served_bytes_as_the_arrays_published(tmp_path, atari_arrays):
    store = ParameterStore()
    store.publish(atari_arrays, update_step=1)
    config = LearnerConfig(env=ENV, checkpoint_dir=str(tmp_path / "ckpt"))
    with serve_learner(tmp_path, store, atari_arrays, config) as (address, _):
        with LearnerClient(address, timeout=30) as client:
            first = client.get_parameters(0, "actor-a")
            assert (first.version, first.actor_index, first.num_actors) == (1, 0, 1)
            assert first.exploration == pytest.approx(0.4) and first.algorithm == "dqn"
            for name, array in atari_arrays.items():
                np.testing.assert_array_equal(first.arrays[name], array, err_msg=name)
                assert first.arrays[name].dtype == array.dtype
            second = {
                name: a + np.float32(0.5) if a.ndim == 1 else a for name, a in atari_arrays.items()
            }
            store.publish(second, update_step=2)
            # The shipping client asks for changes: the biases travel, the rest stays.
            newer = client.get_parameters(first.version, "actor-a", first.lineage)
            assert newer.version == 2
            for name, array in second.items():
                np.testing.assert_array_equal(newer.arrays[name], array, err_msg=name)
        with grpc.insecure_channel(
            address, options=[("grpc.max_receive_message_length", 64 << 20)]
        ) as channel:
            stub = learner_pb2_grpc.LearnerStub(channel)
            raw = stub.GetParameters(learner_pb2.GetParametersRequest(actor_id="b"), timeout=30)
    head = learner_pb2.GetParametersResponse(
        lease_seconds=30.0,
        algorithm="dqn",
        actor_index=1,
        num_actors=2,
        exploration=0.4**8,
        epsilon=0.4**8,
    )
    reference = field_by_field(head, 2, 2, 2, store.lineage, second)
    assert_same_message(raw.SerializeToString(), reference)
