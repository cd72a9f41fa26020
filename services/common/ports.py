"""Ports a parent picks for the children it starts, so that none waits for another's ready file
to learn where its peers are (local mode)."""

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
SPAN = 12_000  # ports drawn from the SPAN just below the ephemeral range


def free_port(rng: random.Random | None = None) -> int:
    """A TCP port free on loopback now, for a child to bind a moment later. Drawn below the
    kernel's ephemeral range: a port from that range (what binding port 0 gives) can be handed
    to an outgoing connection of any process before the child binds it (a learner's bind
    failed so once in 400 starts of local mode)."""
    rng = rng or random.Random()
    low = ephemeral_low()
    for _ in range(100):
        port = rng.randrange(max(1024, low - SPAN), low)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as sock:  # nothing free below the range: the kernel's pick
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (32768, Linux's default, where unreadable)."""
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768
