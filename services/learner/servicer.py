"""The Learner gRPC service: parameters and leases for actors, evaluation reports, live
changes of settings (SetSetting: learner/scheduled.py).

GetParameters answers with bytes serialized by the ParameterStore (each version's parameters
encoded once, at publish): `long_poll.add_learner_service` registers it with no response
serializer."""

import asyncio
import math
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import grpc
import prometheus_client

from apexrl.algorithms.base import Builder
from apexrl.common.errors import FailedPrecondition, InvalidArgument
from apexrl.common.long_poll import LongPolls
from apexrl.common.parameters import ParameterStore
from apexrl.learner.best import BestModel
from apexrl.learner.leases import Leases
from apexrl.v1 import learner_pb2, learner_pb2_grpc

if TYPE_CHECKING:
    from apexrl.learner.training import Learner

MAX_WAIT_SECONDS = 60.0  # GetParametersRequest.wait_seconds


class LearnerServicer(learner_pb2_grpc.LearnerServicer):
    def __init__(
        self,
        store: ParameterStore,
        leases: Leases,
        live_actors: prometheus_client.Gauge,
        best: BestModel,
        builder: Builder,
        bytes_sent: prometheus_client.Counter | None = None,
        learner: "Learner | None" = None,
    ):
        """learner: the training one, whose settings SetSetting changes (None: it refuses)."""
        self.store, self.leases, self.live_actors, self.best = store, leases, live_actors, best
        self.builder, self.bytes_sent, self.learner = builder, bytes_sent, learner
        self.polls = LongPolls(store)
        # Reports take BestModel's lock one at a time: one thread of their own, where asyncio's
        # default pool would add a thread whenever two reports meet and keep it for good. It
        # starts here, not at the first report: a learner's thread count is set from the start.
        self._reports = ThreadPoolExecutor(1, thread_name_prefix="report")
        self._reports.submit(lambda: None)

    async def GetParameters(self, request, context):
        if len(request.actor_id) > 128:
            raise InvalidArgument("actor_id", f"{len(request.actor_id)} characters, at most 128")
        wait = request.wait_seconds
        if not 0 <= wait <= MAX_WAIT_SECONDS or not math.isfinite(wait):
            raise InvalidArgument(
                "wait_seconds", f"must be finite, 0 to {MAX_WAIT_SECONDS:g}, got {wait}"
            )
        if self.store.version == 0:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "no parameters published yet")
        response = learner_pb2.GetParametersResponse(
            lease_seconds=self.leases.seconds, algorithm=self.builder.name
        )
        if request.actor_id:  # renewed as the call arrives: a long poll keeps its lease
            index, count = self.leases.renew(request.actor_id, time.monotonic())
            response.actor_index, response.num_actors = index, count
            response.exploration = self.builder.exploration(index, count)
            if self.builder.metrics.exploration == "epsilon":  # the field older actors read
                response.epsilon = response.exploration
            self.live_actors.set(count)
        if request.lease_only:
            answer = self.store.newest_head(response)
        else:
            if wait:
                await self.polls.wait_for_newer(
                    request.have_version, request.have_lineage, wait, context
                )
            held = (request.have_version, request.have_lineage)
            answer = self.store.serialize(response, *held, request.in_order, request.accept_changes)
        if self.bytes_sent is not None:
            self.bytes_sent.inc(len(answer))
        return answer

    async def ReportEvaluation(self, request, context):
        loop = asyncio.get_running_loop()  # the report may write a checkpoint
        return await loop.run_in_executor(self._reports, self.best.report, request)

    async def SetSetting(self, request, context):
        if self.learner is None:
            raise FailedPrecondition(
                "name", "this learner serves no training: no settings to change"
            )
        previous = self.learner.scheduled.change(request.name, request.value)
        return learner_pb2.SetSettingResponse(
            previous=previous, update_step=self.learner.update_step
        )
