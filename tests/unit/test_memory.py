"""glibc malloc in the services (apexrl.common.memory): a service process keeps two arenas
(apexrl.cli; with one per thread a learner's heaps kept growing for its first 20 minutes, which
the soak's resource check reads as a leak), and an actor gives the memory of an insert backlog
back to the OS once the backlog has landed."""

import os
import subprocess
import sys
import threading

import numpy as np
import prometheus_client
import pytest

from apexrl.actor import loop
from tests.conftest import wait_for

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")

# Eight threads allocate at once, then glibc's malloc_stats() lists the arenas (on stderr).
CODE = """
import ctypes, threading
{imports}
barrier = threading.Barrier(8)
def work():
    kept = [bytearray(100_000) for _ in range(10)]
    barrier.wait()
    kept.clear()
threads = [threading.Thread(target=work) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
ctypes.CDLL(None).malloc_stats()
"""


def arenas(imports: str, **environ: str) -> int:
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"} | environ
    result = subprocess.run([sys.executable, "-c", CODE.format(imports=imports)],
                            capture_output=True, text=True, timeout=60, env=env)  # fmt: skip
    assert result.returncode == 0, result.stderr
    return sum(line.startswith("Arena ") for line in result.stderr.splitlines())


def test_a_service_process_uses_two_malloc_arenas():
    assert arenas("") > 2  # what a plain process does: the check below can fail
    assert arenas("import apexrl.cli") == 2


def test_the_users_own_arena_setting_wins():
    assert arenas("import apexrl.cli", MALLOC_ARENA_MAX="4") > 2


RSS = "int(open('/proc/self/statm').read().split()[1]) * 4096 / 2**20"
BURST = """
import gc, numpy
from apexrl.common.memory import release_free_memory
kept = [({{k: numpy.ones((64, 4), numpy.float32) for k in "abcde"}}, [object()] * 8)
        for _ in range(3000)]
peak = {rss}
del kept; gc.collect()
freed = {rss}
release_free_memory()
print(peak, freed, {rss})
"""


def test_released_memory_leaves_the_rss():
    result = subprocess.run([sys.executable, "-c", BURST.format(rss=RSS)],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stderr
    peak, freed, released = map(float, result.stdout.split())
    assert freed > peak - 2  # freeing alone leaves the burst in the RSS ...
    assert released < freed - 2, (peak, freed, released)  # ... the release takes it out


class FlakyReplay:
    """Refuses inserts while `away` is set."""

    def __init__(self):
        self.away, self.landed = threading.Event(), []

    def insert(self, columns, priorities):
        if self.away.is_set():
            raise ConnectionError("replay away")
        self.landed.append(len(priorities))

    def close(self):
        pass


def test_an_actor_releases_its_backlog_once_it_has_landed(monkeypatch):
    released = threading.Event()
    monkeypatch.setattr(loop, "release_free_memory", released.set)
    metrics = loop.ActorMetrics(prometheus_client.CollectorRegistry(), "epsilon", "")
    replay, stop = FlakyReplay(), threading.Event()
    buffer = loop.InsertBuffer(replay, 10_000, metrics, stop)
    batch = ({"x": np.zeros(8, np.float32)}, np.ones(8))
    for _ in range(3):  # replay there: nothing held for an outage, nothing to release
        buffer.put(*batch)
    wait_for(lambda: sum(replay.landed) == 24, 30, "the inserts to land")
    assert not released.is_set()
    replay.away.set()
    for _ in range(20):  # held while replay is away
        buffer.put(*batch)
    replay.away.clear()
    assert released.wait(30) and sum(replay.landed) == 24 + 160
    buffer.close(5.0)
