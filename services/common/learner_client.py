"""LearnerClient: what actors and evaluators ask the learner for.

It lives with the plumbing, not in learner/, so that actors and evaluators reach the learner
through the wire contract without importing the learner service (services never import
each other).
"""

import threading
from dataclasses import dataclass

import numpy as np

from apexrl.common import tensors
from apexrl.common.client import GrpcClient
from apexrl.v1 import learner_pb2, learner_pb2_grpc


@dataclass
class Parameters:
    version: int
    lineage: int  # the learner process's; send it back with the version (learner.proto)
    update_step: int
    arrays: dict[str, np.ndarray]  # empty when the caller already had this version; read-only
    exploration: float  # the algorithm's exploration parameter for this actor's place
    actor_index: int
    num_actors: int
    algorithm: str  # the learner's
    newest_version: int = 0  # the learner's newest (> version when in_order answered older)
    lease_seconds: float = 0.0  # 0: no lease came with it (no actor_id, or a relay answered)


def apply_changes(
    held: Parameters | None, response: learner_pb2.GetParametersResponse, changed: dict
) -> dict[str, np.ndarray]:
    """The whole arrays of a change set over the held version (learner.proto: changes_from)."""
    if held is None or held.version != response.changes_from:
        raise ValueError(
            f"changes_from: {response.changes_from}, but the version held is"
            f" {held.version if held else 'none'}"
        )
    arrays = dict(held.arrays)
    for name, values in changed.items():
        if name not in arrays:
            raise ValueError(f'parameters["{name}"]: not among the held version\'s arrays')
        if name in response.rows:
            rows = tensors.array_from_proto(response.rows[name], f'rows["{name}"]')
            array = arrays[name].copy()
            array[rows] = values
            array.setflags(write=False)
            values = array
        arrays[name] = values
    return arrays


class LearnerClient(GrpcClient):
    def __init__(self, address: str, *, timeout: float = 10.0, **options):
        """options: retry_seconds, retry_cap, max_message_mb, tls (see GrpcClient)."""
        super().__init__(address, timeout=timeout, **options)
        self.stub = learner_pb2_grpc.LearnerStub(self.channel)
        self._held: Parameters | None = None  # the last whole parameters received

    def get_parameters(
        self,
        have_version: int = 0,
        actor_id: str = "",
        have_lineage: int = 0,
        wait_seconds: float = 0.0,
        in_order: bool = False,
        metadata: tuple = (),
    ) -> Parameters:
        """The newest parameters (none if have_version/have_lineage are the newest);
        wait_seconds > 0: a long poll, answered when a newer version is published or then;
        in_order: the version after have_version while the learner keeps it (learner.proto).
        When the version held is the last one this client received, only the rows that changed
        since travel (accept_changes); the arrays returned are whole either way. metadata:
        gRPC metadata sent with the call (a relay's path, relay/servicer.py)."""
        held = self._held
        request = learner_pb2.GetParametersRequest(
            have_version=have_version,
            actor_id=actor_id,
            have_lineage=have_lineage,
            wait_seconds=wait_seconds,
            in_order=in_order,
            accept_changes=held is not None
            and (held.version, held.lineage) == (have_version, have_lineage),
        )
        timeout = self.timeout + wait_seconds
        response = self._retry(
            lambda: self._until_stop(request, timeout, metadata), "get_parameters"
        )
        arrays = {
            name: tensors.array_from_proto(t, f'parameters["{name}"]')
            for name, t in response.parameters.items()
        }
        if response.changes_from:
            arrays = apply_changes(held, response, arrays)
        params = Parameters(
            version=response.version,
            lineage=response.lineage,
            update_step=response.update_step,
            arrays=arrays,
            exploration=response.exploration,
            actor_index=response.actor_index,
            num_actors=response.num_actors,
            algorithm=response.algorithm,
            newest_version=response.newest_version,
            lease_seconds=response.lease_seconds,
        )
        if arrays:
            self._held = params
        return params

    def renew_lease(self, actor_id: str) -> Parameters:
        """Renews the lease of `actor_id` without parameters (learner.proto: lease_only): its
        place in the ladder, with the learner's newest version and lineage, no arrays."""
        request = learner_pb2.GetParametersRequest(actor_id=actor_id, lease_only=True)
        response = self._retry(
            lambda: self._until_stop(request, self.timeout), "get_parameters (lease)"
        )
        return Parameters(
            version=response.version,
            lineage=response.lineage,
            update_step=response.update_step,
            arrays={},
            exploration=response.exploration,
            actor_index=response.actor_index,
            num_actors=response.num_actors,
            algorithm=response.algorithm,
            newest_version=response.newest_version,
            lease_seconds=response.lease_seconds,
        )

    def _until_stop(
        self, request: learner_pb2.GetParametersRequest, timeout: float, metadata: tuple = ()
    ) -> learner_pb2.GetParametersResponse:
        """GetParameters, cancelled (grpc.FutureCancelledError) once the process's stop is set:
        a stopping actor or evaluator does not wait out a long poll."""
        if self.stop is None:
            return self.stub.GetParameters(request, timeout=timeout, metadata=metadata)
        call = self.stub.GetParameters.future(request, timeout=timeout, metadata=metadata)
        done = threading.Event()
        call.add_done_callback(lambda _: done.set())
        while not done.wait(0.02):  # woken by the answer; looks at stop every 20 ms
            if self.stop.is_set():
                call.cancel()
                break
        return call.result()

    def report_evaluation(
        self,
        params: Parameters,
        returns: np.ndarray,
        *,
        env: str,
        first_seed: int,
        epsilon: float,
    ) -> learner_pb2.ReportEvaluationResponse:
        """Reports the returns that `params` (as received, with their arrays) earned."""
        request = learner_pb2.ReportEvaluationRequest(
            version=params.version,
            lineage=params.lineage,
            update_step=params.update_step,
            returns=[float(r) for r in returns],
            env=env,
            first_seed=first_seed,
            epsilon=epsilon,
        )
        for name, array in params.arrays.items():
            tensors.to_proto(array, request.parameters[name])
        return self._retry(
            lambda: self.stub.ReportEvaluation(request, timeout=self.timeout), "report_evaluation"
        )

    def set_setting(self, name: str, value: float) -> learner_pb2.SetSettingResponse:
        """Changes a setting of the running learner (SetSetting); not retried: a change the
        learner refused, or never got, is the caller's to see."""
        request = learner_pb2.SetSettingRequest(name=name, value=value)
        return self.stub.SetSetting(request, timeout=self.timeout)
