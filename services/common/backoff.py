"""Retrying gRPC calls on UNAVAILABLE with capped exponential backoff and full jitter."""

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
) -> T:
    """Calls `call` until it does not fail with UNAVAILABLE, for at most `retry_seconds` (None:
    forever), with Backoff delays up to `cap`, and no more once `stop` is set (a stopping
    process tries once, it does not wait for a server that is away). The first retry of a
    call is logged at INFO, the rest at DEBUG (a server away for a while is one line per
    call, not one per try)."""
    backoff = Backoff(initial=min(0.1, cap), cap=cap)
    give_up = None if retry_seconds is None else time.monotonic() + retry_seconds
    level = logging.INFO
    while True:
        try:
            return call()
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            delay = backoff.next_delay()
            stopping = stop is not None and stop.is_set()
            if stopping or (give_up is not None and time.monotonic() + delay > give_up):
                raise
            log.log(
                level, "%s: server unavailable (%s), retrying in %.2f s", what, err.details(), delay
            )
            level = logging.DEBUG
            if stop is None:
                time.sleep(delay)
            elif stop.wait(delay):
                raise
