"""Retrying gRPC calls while their server is away, with capped exponential backoff and full jitter."""

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import grpc

log = logging.getLogger(__name__)
T = TypeVar("T")

# Channel options so a channel whose server went away reconnects within seconds, not the
# default minutes of gRPC's own backoff; and keepalive pings, so a connection that went
# silent (a network partition drops packets, nobody resets) fails its calls with UNAVAILABLE
# within ~7 s instead of hanging until their deadlines and TCP's retransmission backoff
# (measured: 30 s frozen, then 25 s to recover; tests/integration/test_partition.py).
RECONNECT_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
    ("grpc.keepalive_time_ms", 4000),
    ("grpc.keepalive_timeout_ms", 3000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
]


# A server that goes away ends the calls in flight with UNAVAILABLE, or with CANCELLED when its
# own stop cancels them (serving.stop_server: grpc's stop(0) once the handlers' grace is over,
# for calls that arrived meanwhile). Both are retried; a CANCELLED the caller caused itself
# (its stop set, its channel closed) never is.
GONE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)


def server_gone(err: grpc.RpcError, stopping: bool = False) -> bool:
    """True when `err` says the server went away, not that the call failed, and the caller is
    not stopping (a stopping caller's own cancellations read CANCELLED too)."""
    return not stopping and err.code() in GONE


class Backoff:
    """Delays of 0.1 s doubling to `cap`, each drawn uniformly below the current bound."""

    def __init__(self, initial: float = 0.1, cap: float = 5.0):
        self.initial, self.cap = initial, cap
        self.bound = initial

    def next_delay(self) -> float:
        delay = random.uniform(0, self.bound)
        self.bound = min(self.cap, self.bound * 2)
        return delay

    def reset(self) -> None:
        self.bound = self.initial


def retry_unavailable(
    call: Callable[[], T],
    what: str,
    retry_seconds: float | None,
    cap: float = 5.0,
    stop: threading.Event | None = None,
    closed: Callable[[], bool] = lambda: False,
) -> T:
    """Calls `call` until it does not fail because its server is away (server_gone), for at
    most `retry_seconds` (None: forever), with Backoff delays up to `cap`, and no more once
    `stop` is set or `closed()` (a stopping process tries once, it does not wait for a
    server that is away; a call its own stop cancelled is raised, not retried). The first
    retry of a call is logged at INFO, the rest at DEBUG (a server away for a while is one
    line per call, not one per try)."""
    backoff = Backoff(initial=min(0.1, cap), cap=cap)
    give_up = None if retry_seconds is None else time.monotonic() + retry_seconds
    level = logging.INFO
    while True:
        try:
            return call()
        except grpc.RpcError as err:
            stopping = (stop is not None and stop.is_set()) or closed()
            if not server_gone(err, stopping):
                raise
            delay = backoff.next_delay()
            if give_up is not None and time.monotonic() + delay > give_up:
                raise
            log.log(
                level, "%s: server unavailable (%s), retrying in %.2f s", what, err.details(), delay
            )
            level = logging.DEBUG
            if stop is None:
                time.sleep(delay)
            elif stop.wait(delay):
                raise
