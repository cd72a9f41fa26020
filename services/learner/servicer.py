"""The Learner gRPC service: parameters and leases for actors, evaluation reports."""

import asyncio
import time

import grpc
import prometheus_client

from apexrl.algorithms.base import Algorithm
from apexrl.common.errors import InvalidArgument
from apexrl.learner.best import BestModel
from apexrl.learner.leases import Leases
from apexrl.learner.parameters import ParameterStore
from apexrl.v1 import learner_pb2, learner_pb2_grpc


class LearnerServicer(learner_pb2_grpc.LearnerServicer):
    def __init__(
        self,
        store: ParameterStore,
        leases: Leases,
        live_actors: prometheus_client.Gauge,
        best: BestModel,
        algorithm: Algorithm,
    ):
        self.store, self.leases, self.live_actors, self.best = store, leases, live_actors, best
        self.algorithm = algorithm

    async def GetParameters(self, request, context):
        if len(request.actor_id) > 128:
            raise InvalidArgument("actor_id", f"{len(request.actor_id)} characters, at most 128")
        if self.store.version == 0:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "no parameters published yet")
        response = learner_pb2.GetParametersResponse(
            lease_seconds=self.leases.seconds, algorithm=self.algorithm.name
        )
        self.store.fill(response, request.have_version, request.have_lineage)
        if request.actor_id:
            index, count = self.leases.renew(request.actor_id, time.monotonic())
            response.actor_index, response.num_actors = index, count
            response.exploration = self.algorithm.exploration(index, count)
            if self.algorithm.exploration_name == "epsilon":  # the field older actors read
                response.epsilon = response.exploration
            self.live_actors.set(count)
        return response

    async def ReportEvaluation(self, request, context):
        return await asyncio.to_thread(self.best.report, request)  # may write a checkpoint
