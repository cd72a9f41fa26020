"""The relay's gRPC service: the learner's own Learner service, GetParameters answered from the
versions the relay pulled (each encoded once, at its arrival), so that an actor points at a
relay as at a learner. No leases (an actor renews its lease at the learner, lease_only) and no
evaluation reports (an evaluator reports to the learner, which owns the best model)."""

import math

import grpc

from apexrl.common.errors import FailedPrecondition, InvalidArgument
from apexrl.common.long_poll import LongPolls
from apexrl.common.parameters import ParameterStore
from apexrl.relay.metrics import RelayMetrics
from apexrl.relay.path import LOOP, PATH_KEY, RelayPath
from apexrl.relay.upstream import RelayLoop, Upstream
from apexrl.v1 import learner_pb2, learner_pb2_grpc

MAX_WAIT_SECONDS = 60.0  # GetParametersRequest.wait_seconds, as the learner's


class RelayServicer(learner_pb2_grpc.LearnerServicer):
    def __init__(
        self,
        store: ParameterStore,
        upstream: Upstream,
        path: RelayPath,
        metrics: RelayMetrics,
        on_loop,
    ):
        self.store, self.upstream, self.path, self.metrics = store, upstream, path, metrics
        self.on_loop = on_loop
        self.polls = LongPolls(store)

    async def GetParameters(self, request, context):
        if not self.path.arrived(context.invocation_metadata()):
            self.on_loop(RelayLoop(self.upstream.address))
            raise FailedPrecondition(PATH_KEY, f"{LOOP}: this relay is upstream of itself")
        if len(request.actor_id) > 128:
            raise InvalidArgument("actor_id", f"{len(request.actor_id)} characters, at most 128")
        wait = request.wait_seconds
        if not 0 <= wait <= MAX_WAIT_SECONDS or not math.isfinite(wait):
            raise InvalidArgument(
                "wait_seconds", f"must be finite, 0 to {MAX_WAIT_SECONDS:g}, got {wait}"
            )
        if request.lease_only:
            raise FailedPrecondition(
                "lease_only", "a parameter relay grants no leases: renew the lease at the learner"
            )
        if self.store.version == 0:
            await context.abort(
                grpc.StatusCode.UNAVAILABLE,
                f"no parameters pulled from {self.upstream.address} yet",
            )
        self.metrics.client(request.actor_id or context.peer())
        if wait:
            await self.polls.wait_for_newer(
                request.have_version, request.have_lineage, wait, context
            )
        head = learner_pb2.GetParametersResponse(algorithm=self.upstream.algorithm)
        held = (request.have_version, request.have_lineage)
        answer = self.store.serialize(head, *held, request.in_order, request.accept_changes)
        self.metrics.answers.inc()
        self.metrics.bytes_served.inc(len(answer))
        return answer

    async def ReportEvaluation(self, request, context):
        raise FailedPrecondition(
            "ReportEvaluation", "a parameter relay keeps no best model: report to the learner"
        )

    async def SetSetting(self, request, context):
        raise FailedPrecondition(
            "name", "a parameter relay has no training settings: send the change to the learner"
        )
