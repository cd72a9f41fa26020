"""Parameters by change sets (learner.proto's accept_changes) through local mode's real nec
processes: a caller a few versions behind pulls the rows that changed, far fewer bytes than the
whole, and patching them into what it held gives the newest version bit for bit; the actor acts
on versions pulled that way."""

import grpc
import numpy as np

from apexrl.common import tensors
from apexrl.common.learner_client import LearnerClient, Parameters, apply_changes
from apexrl.local.settings import parse
from apexrl.local.supervision import Run
from apexrl.v1 import learner_pb2, learner_pb2_grpc
from tests.conftest import wait_for


def whole(stub, version: int, lineage: int) -> learner_pb2.GetParametersResponse | None:
    """Version `version` whole, or None when the learner has moved past it."""
    response = stub.GetParameters(learner_pb2.GetParametersRequest(
        have_version=version - 1, have_lineage=lineage, in_order=True), timeout=10)  # fmt: skip
    return response if response.version == version else None


def decoded(response) -> dict[str, np.ndarray]:
    return {n: tensors.from_proto(t, n) for n, t in response.parameters.items()}


def test_a_caller_behind_gets_the_changed_rows_and_rebuilds_the_newest(tmp_path):
    config = parse(["--algorithm", "nec", "--actors", "1", "--run-dir",
                          str(tmp_path / "run"), "--seed", "1"])  # fmt: skip
    run = Run(config, {}, tmp_path / "run")
    try:
        run.start_all()
        learner, actor = (
            next(c for c in run.children if c.name == n) for n in ("learner", "actor-0")
        )

        def learner_metric(name: str) -> float:
            return learner.metrics().get(f"apexrl_learner_{name}", 0)

        wait_for(lambda: learner_metric("parameter_version") >= 5, 180, "5 versions")
        channel = grpc.insecure_channel(run.learner_address)
        stub = learner_pb2_grpc.LearnerStub(channel)
        checked = 0
        while checked < 3:
            first = stub.GetParameters(learner_pb2.GetParametersRequest(), timeout=10)
            held = Parameters(first.version, first.lineage, 0, decoded(first), 0.0, 0, 0, "nec")
            # Several versions behind: the change set is the union of their changed rows.
            wait_for(lambda v=held.version: learner_metric("parameter_version") >= v + 3, 60,
                     "3 more versions")  # fmt: skip
            changes = stub.GetParameters(learner_pb2.GetParametersRequest(
                have_version=held.version, have_lineage=held.lineage, accept_changes=True),
                timeout=10)  # fmt: skip
            newest = whole(stub, changes.version, changes.lineage)
            if newest is None:
                continue  # published in between: try again
            assert changes.changes_from == held.version and changes.version >= held.version + 3
            assert changes.rows and changes.ByteSize() < newest.ByteSize() / 2, (
                changes.ByteSize(), newest.ByteSize())  # fmt: skip
            print(f"{changes.version - held.version} versions behind: {changes.ByteSize():,} B"
                  f" of changes, {newest.ByteSize():,} B whole")  # fmt: skip
            rebuilt = apply_changes(held, changes, decoded(changes))
            want = decoded(newest)
            assert set(rebuilt) == set(want)
            for name, array in want.items():
                np.testing.assert_array_equal(rebuilt[name], array, err_msg=name)
            checked += 1
        channel.close()
        # The shipping client takes the same path and hands out whole arrays.
        with LearnerClient(run.learner_address) as client:
            params = client.get_parameters()
            wait_for(
                lambda: learner_metric("parameter_version") >= params.version + 2, 60, "2 more"
            )
            again = client.get_parameters(params.version, have_lineage=params.lineage)
            with grpc.insecure_channel(run.learner_address) as plain:
                newest = whole(learner_pb2_grpc.LearnerStub(plain), again.version, again.lineage)
            if newest is not None:
                for name, array in decoded(newest).items():
                    np.testing.assert_array_equal(again.arrays[name], array, err_msg=name)
        assert 0 < learner_metric("parameter_change_bytes") < learner_metric("parameter_bytes") / 2
        # The actor keeps up with the learner on what it pulled.
        version = learner_metric("parameter_version")
        wait_for(lambda: actor.metrics().get("apexrl_actor_parameter_version", 0) >= version, 60,
                 "the actor on a newer version")  # fmt: skip
    finally:
        for child in run.children:
            if child.process.poll() is None:
                child.process.kill()
                child.process.wait()
