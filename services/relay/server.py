"""The parameter relay, wired: pulls each version from upstream once (relay/upstream.py) and
serves it over the learner's GetParameters (relay/servicer.py) to the actors near it.

`build` returns the Service and the Relay; a relay that finds itself in a loop of relays sets
`relay.stop` with `relay.error` (the cli exits 2 with its message, naming the setting).
"""

import asyncio

import prometheus_client

from apexrl.common.long_poll import add_learner_service
from apexrl.common.parameters import ParameterStore
from apexrl.common.serving import Service
from apexrl.config import RelayConfig
from apexrl.relay.metrics import RelayMetrics
from apexrl.relay.path import RelayPath
from apexrl.relay.servicer import RelayServicer
from apexrl.relay.upstream import Upstream
from apexrl.v1 import learner_pb2


class Relay:
    def __init__(self, config: RelayConfig, registry: prometheus_client.CollectorRegistry):
        self.stop = asyncio.Event()  # serve's: set at SIGTERM, or by a loop found
        self.error: ValueError | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.metrics = RelayMetrics(registry)
        self.store = ParameterStore()
        self.path = RelayPath()
        self.upstream = Upstream(config, self.store, self.metrics, self.path, self.fail)
        self.servicer = RelayServicer(self.store, self.upstream, self.path, self.metrics, self.fail)

    def fail(self, error: ValueError) -> None:
        """Stops the relay with `error` (from any thread)."""
        if self.error is None:
            self.error = error
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.stop.set)

    def service(self) -> Service:
        def register(server) -> list[str]:
            add_learner_service(self.servicer, server)
            return [learner_pb2.DESCRIPTOR.services_by_name["Learner"].full_name]

        async def start() -> None:
            self._loop = asyncio.get_running_loop()
            if self.error is not None:
                self.stop.set()
            self.upstream.start()

        async def stop_pulling() -> None:
            self.servicer.polls.stop()
            await asyncio.to_thread(self.upstream.stop)

        return Service(register=register, on_shutdown=stop_pulling, background=[start])


def build(
    config: RelayConfig, registry: prometheus_client.CollectorRegistry
) -> tuple[Service, Relay]:
    relay = Relay(config, registry)
    return relay.service(), relay
