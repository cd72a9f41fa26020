"""The server bootstrap every apexrl service shares.

One function, `serve`, gives a service: a grpc.aio server with explicit message size
limits, the standard health service and reflection (so grpcurl works), per-RPC metrics
(grpc_server_* names as in go-grpc-prometheus) and request errors turned into status codes
by one interceptor (interceptor.py), Prometheus /metrics on its own port, and graceful
shutdown on SIGTERM or SIGINT: health NOT_SERVING, in-flight calls get `grace_seconds`, then
the service's own `on_stop` (e.g. a final checkpoint), then return so the process exits 0.
"""

import asyncio
import json
import logging
import math
import os
import resource
import signal
import threading
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import grpc
import prometheus_client
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from apexrl.common.authz import Authorizer
from apexrl.common.interceptor import RpcMetrics, ServiceInterceptor
from apexrl.common.metrics_http import start_metrics_server, stop_metrics_server
from apexrl.config import ProcessConfig, ServeConfig

log = logging.getLogger(__name__)


def new_registry() -> prometheus_client.CollectorRegistry:
    """A process's metrics registry: its own metrics plus process_* (memory, CPU, start time:
    restarts show as a new process_start_time_seconds) and the memory limit it runs under."""
    registry = prometheus_client.CollectorRegistry()
    prometheus_client.ProcessCollector(registry=registry)
    limit = prometheus_client.Gauge(
        "apexrl_memory_limit_bytes",
        "Memory limit of this process's cgroup (container); +Inf when unlimited.",
        registry=registry,
    )
    limit.set_function(memory_limit_bytes)
    return registry


def memory_limit_bytes() -> float:
    """The cgroup memory limit (v2 memory.max, else v1 memory.limit_in_bytes); inf if none."""
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as fh:
                text = fh.read().strip()
        except OSError:
            continue
        # v1 reports "no limit" as a huge number near 2^63.
        return math.inf if text == "max" or int(text) >= 2**62 else float(text)
    return math.inf


def message_options(max_message_mb: int) -> list[tuple[str, int]]:
    """Explicit send/receive limits: gRPC's defaults (4 MiB in) are too small for Atari batches."""
    limit = max_message_mb * 1024 * 1024
    return [("grpc.max_send_message_length", limit), ("grpc.max_receive_message_length", limit)]


# Servers accept the clients' keepalive pings (RECONNECT_OPTIONS: every 4 s, also when idle)
# instead of answering them with GOAWAY too_many_pings, and ping their own clients so a
# stream to a vanished peer is released.
SERVER_KEEPALIVE_OPTIONS = [
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 1000),
    ("grpc.http2.max_ping_strikes", 0),
    ("grpc.keepalive_time_ms", 10000),
    ("grpc.keepalive_timeout_ms", 5000),
]


# Limits for hundreds of clients (docs/scaling.md#grpc-limits). Each actor holds one connection
# to the learner and one to each replay shard, with a few calls at once on it (an insert
# stream, a pull or a long poll): a peer that opens more streams waits for its own to end.
MAX_CONCURRENT_STREAMS = 100  # per connection (HTTP/2's recommended minimum)
# Files a server opens besides its connections: listening sockets, /metrics, logs, checkpoints.
RESERVED_FILES = 64


def open_files_limit() -> int:
    """Raises this process's soft limit on open files to its hard limit (every connection is
    one: the default soft 1,024 would fail accepts, and checkpoint writes, past ~1,000
    actors) and returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):  # an unlimited hard limit above the kernel's nr_open
            log.info("open files: keeping the soft limit %d (hard %d)", soft, hard)
    return soft


def connection_options() -> list[tuple[str, int]]:
    """Concurrent streams per connection, and connections at most the open files left once
    RESERVED_FILES are set aside: one more is refused by gRPC, not failed by the OS."""
    connections = max(open_files_limit() - RESERVED_FILES, RESERVED_FILES)
    return [
        ("grpc.max_concurrent_streams", MAX_CONCURRENT_STREAMS),
        ("grpc.max_allowed_incoming_connections", connections),
    ]


@dataclass
class Service:
    """What a service plugs into `serve`."""

    # Adds the servicers to the server; returns their full service names (for health and
    # reflection).
    register: Callable[[grpc.aio.Server], list[str]]
    # Called when shutdown begins, before in-flight calls get their grace (release waiters).
    on_shutdown: Callable[[], Awaitable[None]] | None = None
    # Called after the gRPC server has stopped (final checkpoint and the like).
    on_stop: Callable[[], Awaitable[None]] | None = None
    # Background tasks to run while serving (periodic checkpoints, training loops); cancelled
    # on stop.
    background: list[Callable[[], Coroutine[Any, Any, None]]] | None = None


async def serve(
    config: ServeConfig,
    service: Service,
    registry: prometheus_client.CollectorRegistry,
    stop: asyncio.Event | None = None,
) -> None:
    """Runs until SIGTERM/SIGINT (or `stop` is set), then shuts down gracefully."""
    # Only mutual TLS names the caller: there each call is checked against the policy.
    authorizer = (
        Authorizer.from_config(config.authorization, registry) if config.tls_client_ca else None
    )
    rpc_metrics = RpcMetrics(registry)
    server = grpc.aio.server(
        interceptors=[ServiceInterceptor(rpc_metrics, authorizer)],
        # gRPC binds with SO_REUSEPORT by default: a second server on a taken port would
        # start and silently take half of its connections; its bind fails instead.
        options=message_options(config.max_message_mb)
        + SERVER_KEEPALIVE_OPTIONS
        + connection_options()
        + [("grpc.so_reuseport", 0)],
    )
    names = service.register(server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        [*names, health.SERVICE_NAME, reflection.SERVICE_NAME], server
    )
    port = add_port(server, config)
    if port == 0:
        raise OSError(f"cannot bind gRPC port {config.host}:{config.port}")
    metrics_http, _ = start_metrics_server(config, registry)
    metrics_port = metrics_http.server_port
    await server.start()
    for name in ["", *names]:
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    log.info(
        "serving %s on %s:%d, metrics on :%d", ", ".join(names), config.host, port, metrics_port
    )
    if config.ready_file:
        write_ready_file(config.ready_file, port=port, metrics_port=metrics_port)

    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    # Signals reach the main thread only; a server run in a thread (tests) stops via `stop`.
    signals = (
        [signal.SIGTERM, signal.SIGINT]
        if threading.current_thread() is threading.main_thread()
        else []
    )
    for sig in signals:
        loop.add_signal_handler(sig, stop.set)
    tasks = [asyncio.create_task(job()) for job in service.background or []]
    try:
        await stop.wait()
        log.info(
            "shutting down: health NOT_SERVING, %.1f s grace for in-flight calls",
            config.grace_seconds,
        )
        await health_servicer.enter_graceful_shutdown()
        if service.on_shutdown is not None:
            await service.on_shutdown()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await stop_server(server, rpc_metrics, config.grace_seconds)
        if service.on_stop is not None:
            await service.on_stop()
    finally:
        stop_metrics_server(metrics_http)
        for sig in signals:
            loop.remove_signal_handler(sig)
    log.info("stopped")


async def stop_server(server: grpc.aio.Server, rpc_metrics: RpcMetrics, grace: float) -> None:
    """Gives the handlers still running up to `grace` seconds to finish, then ends every call.
    A call whose handler is done can still be in flight, its answer waiting for a peer that
    does not read (a client's prefetch queue is full): waiting for those would hold the stop
    for the whole grace."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace
    while rpc_metrics.running and loop.time() < deadline:
        await asyncio.sleep(0.02)
    await server.stop(0)


def add_port(server: grpc.aio.Server, config: ServeConfig) -> int:
    """Binds the gRPC port: TLS when a certificate is configured (mutual with a client CA), else
    plaintext. A TLS server accepts no plaintext connection."""
    address = f"{config.host}:{config.port}"
    if not config.tls_cert and not config.tls_key and not config.tls_client_ca:
        return server.add_insecure_port(address)
    if not (config.tls_cert and config.tls_key):
        raise ValueError("tls_cert and tls_key: TLS needs both (tls_client_ca alone is not enough)")
    with open(config.tls_cert, "rb") as cert, open(config.tls_key, "rb") as key:
        pair = (key.read(), cert.read())
    client_ca = None
    if config.tls_client_ca:
        with open(config.tls_client_ca, "rb") as fh:
            client_ca = fh.read()
    credentials = grpc.ssl_server_credentials(
        [pair], root_certificates=client_ca, require_client_auth=client_ca is not None
    )
    return server.add_secure_port(address, credentials)


def write_ready_file(path: str, **ports: int) -> None:
    """Atomically writes the bound ports, so a parent process can wait for them (port 0)."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump(ports, fh)
    os.replace(tmp, path)


def configure_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def run_worker(
    config: ProcessConfig,
    registry: prometheus_client.CollectorRegistry,
    work: Callable[[threading.Event], None],
) -> None:
    """Runs a process without a gRPC server (actor, evaluator): metrics, ready file, SIGTERM.

    `work(stop)` runs in the calling (main) thread and must return soon after `stop` is set.
    """
    metrics_http, _ = start_metrics_server(config, registry)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    log.info("metrics on :%d", metrics_http.server_port)
    if config.ready_file:
        write_ready_file(config.ready_file, metrics_port=metrics_http.server_port)
    try:
        work(stop)
    finally:
        stop_metrics_server(metrics_http)
    log.info("stopped")
