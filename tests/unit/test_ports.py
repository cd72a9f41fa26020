"""free_port: a loopback port free now, below the kernel's ephemeral range (which outgoing
connections draw from), skipping the taken ones."""

import random
import socket

from apexrl.common import ports


def test_a_free_port_lies_below_the_ephemeral_range_and_binds():
    low = ports.ephemeral_low()
    for _ in range(20):
        port = ports.free_port()
        assert low - ports.SPAN <= port < low
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_a_taken_port_is_skipped():
    low = ports.ephemeral_low()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        picks = iter([busy, low - 7])

        class Draws(random.Random):
            def randrange(self, start, stop):
                port = next(picks)
                assert start <= low - 7 < stop
                return port

        assert ports.free_port(Draws()) == low - 7
