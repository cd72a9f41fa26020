"""What the learner's and the parameter relay's servicers share: long polls on a
ParameterStore (GetParameters with wait_seconds), which return when a version newer than the
caller's is published, after their wait, just before their deadline, or at shutdown; and the
Learner service's registration, with GetParameters's answers already serialized.

The store publishes from another thread (the learner's training, the relay's upstream pull);
each publish wakes, on the servicer's asyncio loop, every poll waiting on it.
"""

import asyncio
import contextlib
from typing import Any

import grpc

from apexrl.common.parameters import ParameterStore
from apexrl.v1 import learner_pb2


class LongPolls:
    def __init__(self, store: ParameterStore):
        self.store = store
        self.stopping = False  # shutdown: polls answer at once
        self.waiting = 0  # polls waiting now
        # Polls wait on this event; each publish sets it and puts a fresh one in place.
        self._published: asyncio.Event | None = None

    def _next_publish(self) -> asyncio.Event:
        """The event the next publish sets (made, and hooked to the store, on first use)."""
        if self._published is None:
            loop = asyncio.get_running_loop()
            self._published = asyncio.Event()

            def published() -> None:  # in the publishing thread
                with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits
                    loop.call_soon_threadsafe(self._wake)

            self.store.on_publish(published)
        return self._published

    def _wake(self) -> None:
        if self._published is not None:
            self._published.set()
            self._published = asyncio.Event()

    def stop(self) -> None:
        """Shutdown: waiting polls answer now, and new ones do not wait."""
        self.stopping = True
        self._wake()

    async def wait_for_newer(self, version: int, lineage: int, wait: float, context) -> None:
        """Returns when a version newer than the one held is published (at once if it is not
        the newest), after `wait` seconds, just before the caller's deadline, or at shutdown."""
        if self.stopping:
            return
        # Taken before the check: a publish after the check sets this very event (both run on
        # this loop), so no wake-up is lost.
        published = self._next_publish()
        if not self.store.holds(version, lineage):
            return
        remaining = context.time_remaining()
        if remaining is not None:
            wait = min(wait, max(0.0, remaining - 0.05))
        self.waiting += 1
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(published.wait(), wait)
        finally:
            self.waiting -= 1


def add_learner_service(servicer, server: grpc.aio.Server) -> None:
    """Registers the Learner service of `servicer` (the learner's or a relay's) as
    learner_pb2_grpc.add_LearnerServicer_to_server does, but with GetParameters's answers
    passed through as the bytes it returns (ParameterStore.serialize: encoded once)."""
    messages: dict[str, tuple[Any, Any]] = {
        "ReportEvaluation": (
            learner_pb2.ReportEvaluationRequest,
            learner_pb2.ReportEvaluationResponse,
        ),
        "SetSetting": (learner_pb2.SetSettingRequest, learner_pb2.SetSettingResponse),
    }
    handlers: dict[str, grpc.RpcMethodHandler] = {
        "GetParameters": grpc.unary_unary_rpc_method_handler(
            servicer.GetParameters,
            request_deserializer=learner_pb2.GetParametersRequest.FromString,
            response_serializer=None,  # bytes from ParameterStore.serialize
        ),
    }
    for method, (request, response) in messages.items():
        handlers[method] = grpc.unary_unary_rpc_method_handler(
            getattr(servicer, method),
            request_deserializer=request.FromString,
            response_serializer=response.SerializeToString,
        )
    name = learner_pb2.DESCRIPTOR.services_by_name["Learner"].full_name
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, handlers),))
    server.add_registered_method_handlers(name, handlers)
