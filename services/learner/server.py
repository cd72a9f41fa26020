"""The learner service, wired: trains an algorithm from replay in a thread (learner/training.py) and
serves its parameters, leases and evaluation reports over gRPC (learner/servicer.py).

The asyncio loop serves GetParameters from the newest published version, encoded once (or,
to evaluators that play every version, from the recent ones history_mb keeps; to callers a few
versions behind, the rows that changed since).
"""

import asyncio
import logging
import math
import os
import threading

import prometheus_client

from apexrl import algorithms
from apexrl.common.long_poll import add_learner_service
from apexrl.common.parameters import ParameterStore
from apexrl.common.serving import Service
from apexrl.config import LearnerConfig
from apexrl.learner.best import BestModel
from apexrl.learner.leases import Leases
from apexrl.learner.live_file import LiveFile
from apexrl.learner.metrics import LearnerMetrics
from apexrl.learner.servicer import LearnerServicer
from apexrl.learner.training import Learner
from apexrl.replay.sharded import connect
from apexrl.v1 import learner_pb2

log = logging.getLogger(__name__)


def build(
    config: LearnerConfig, registry: prometheus_client.CollectorRegistry
) -> tuple[Service, Learner]:
    builder = algorithms.make(config)
    metrics = LearnerMetrics(registry, builder.metrics.figures, builder.metrics.loss_help)
    if not config.history_mb >= 0 or not math.isfinite(config.history_mb):
        raise ValueError(f"history_mb: must be finite and >= 0, got {config.history_mb}")
    store = ParameterStore(int(config.history_mb * 2**20))
    leases = Leases(config.lease_seconds)
    learner = Learner(config, builder, metrics, store)
    best = BestModel(config, learner.learning.parameters())
    servicer = LearnerServicer(
        store, leases, metrics.live_actors, best, builder, metrics.parameter_bytes_sent, learner
    )
    replay = connect(
        config.replay,
        table=learner.dataset.table,
        timeout=30.0,
        retry_seconds=None,
        tls=config,
        stop=learner.stop,
    )

    def train() -> None:
        try:
            learner.train(replay)
        except Exception:
            if learner.stop.is_set():
                return
            # A failing training step is a bug or a broken replay contract: exit non-zero so the
            # supervisor restarts the learner from its last checkpoint.
            log.exception("training failed")
            os._exit(1)

    thread = threading.Thread(target=train, name="train", daemon=True)
    threads = [thread]
    if config.live_file:  # applied now (refused: exit 2), then watched
        live = LiveFile(config.live_file, learner.scheduled, metrics.live_file_failures)
        live.start()
        threads.append(
            threading.Thread(target=live.watch, args=(learner.stop,), name="live", daemon=True)
        )

    def register(server) -> list[str]:
        add_learner_service(servicer, server)
        return [learner_pb2.DESCRIPTOR.services_by_name["Learner"].full_name]

    async def start_training() -> None:
        for started in threads:
            started.start()

    async def stop_training() -> None:
        servicer.polls.stop()
        learner.stop.set()
        replay.close()  # unblocks a prefetch stream the replay rate limiter holds
        for started in threads:
            await asyncio.to_thread(started.join)
        for helper in learner.helpers:
            await asyncio.to_thread(helper.join, 10)

    async def final_checkpoint() -> None:
        learner.checkpoint()

    return Service(
        register=register,
        on_shutdown=stop_training,
        on_stop=final_checkpoint,
        background=[start_training],
    ), learner
