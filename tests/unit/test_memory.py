"""glibc malloc in the services (apexrl.common.memory): a service process keeps two arenas
(apexrl.cli; with one per thread a learner's heaps kept growing for its first 20 minutes, which
the soak's resource check reads as a leak), and an actor gives the memory of an insert backlog
back to the OS once the backlog has landed."""

import gc
import os
import subprocess
import sys
import threading
import weakref

import numpy as np
import prometheus_client
import pytest

from apexrl.actor import loop, outlets
from apexrl.common import codec, memory, tensors
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
        assert len(columns["x"]) == len(priorities)
        self.landed.extend(columns["x"].tolist())

    def close(self):
        pass


def test_an_actor_releases_its_backlog_once_it_has_landed(monkeypatch):
    """Held batches (merged while replay is away) land in order, none twice, then the
    memory is released."""
    released = threading.Event()
    monkeypatch.setattr(outlets, "release_free_memory", released.set)
    metrics = loop.ActorMetrics(prometheus_client.CollectorRegistry(), "epsilon", "")
    replay, stop = FlakyReplay(), threading.Event()
    buffer = outlets.InsertBuffer(replay, 10_000, metrics, stop)
    batches = iter(range(0, 10**6, 8))

    def put():
        first = next(batches)
        buffer.put({"x": np.arange(first, first + 8, dtype=np.float32)}, np.ones(8))

    for _ in range(3):  # replay there: nothing held for an outage, nothing to release
        put()
    wait_for(lambda: len(replay.landed) == 24, 30, "the inserts to land")
    assert not released.is_set()
    replay.away.set()
    for _ in range(20):  # held while replay is away
        put()
    replay.away.clear()
    assert released.wait(30)
    assert replay.landed == list(range(24 + 160))
    buffer.close(5.0)


# While replay is away an actor keeps acting: the batches it holds would lie in malloc's heap
# between whatever it allocates there meanwhile (here 600 bytes kept per batch), and a heap gives
# back no page that a live allocation still touches.
HEAP = """
import re
def heap():
    smaps = open("/proc/self/smaps").read()
    return int(re.search(r"\\[heap\\]\\n(?:.*\\n)*?Rss: +(\\d+)", smaps)[1]) / 1024
def rss():
    return RSS
""".replace("RSS", RSS)
OUTAGE = """
import threading, numpy, prometheus_client
from apexrl.actor import loop, outlets
from apexrl.common.memory import release_free_memory
class Replay:
    away, landed = True, 0
    def insert(self, columns, priorities):
        if self.away:
            raise ConnectionError("replay away")
        self.landed += len(priorities)
    def close(self):
        pass
replay, stop = Replay(), threading.Event()
metrics = loop.ActorMetrics(prometheus_client.CollectorRegistry(), "epsilon", "")
buffer = outlets.InsertBuffer(replay, 10**7, metrics, stop)
def batch():
    return {k: numpy.ones((64, 4), numpy.float32) for k in "abcde"}, numpy.ones(64)
buffer.put(*batch())
while not buffer._outage:
    stop.wait(0.01)
release_free_memory()
before, kept = (heap(), rss()), []
for _ in range(3000):
    buffer.put(*batch())
    kept.append(bytes(600))
replay.away = False
while replay.landed < 64 * 3001:
    stop.wait(0.05)
buffer.close(5.0)
release_free_memory()
print(*before, heap(), rss())
"""


def test_an_outage_backlog_leaves_the_rss_once_it_has_landed():
    """3,000 batches of 5.6 KB held (17 MB): malloc's heap and the whole RSS grow by what was
    kept meanwhile only (1.9 MB), not by what the batches' objects left behind."""
    result = subprocess.run([sys.executable, "-c", HEAP + OUTAGE], capture_output=True,
                            text=True, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr
    heap_before, rss_before, heap_after, rss_after = map(float, result.stdout.split())
    assert heap_after < heap_before + 1.9 + 2, result.stdout
    assert rss_after < rss_before + 1.9 + 2, result.stdout


def fail_holding(batch) -> None:
    """A call that fails while it carries `batch`, its error kept as a retry loop keeps its
    last one: the error's traceback holds this frame, whose locals hold the error."""

    def send(batch):
        raise ConnectionError("replay away")

    try:
        send(batch)
    except ConnectionError as err:
        error = err  # noqa: F841 (the cycle)


def test_released_memory_includes_a_held_batch_that_only_a_cycle_still_holds():
    gc.disable()  # as if no full collection came soon (an actor allocates few objects)
    try:
        columns, priorities = memory.off_heap({"x": np.ones((64, 4), np.float32)}, np.ones(64))
        held = weakref.ref(priorities)
        fail_holding((columns, priorities))
        del columns, priorities
        assert held() is not None  # only the failed call's frames hold it now
        memory.release_free_memory()
        assert held() is None
    finally:
        gc.enable()


def test_a_batch_off_the_heap_is_an_equal_copy():
    frames = codec.compress(np.arange(3 * 84 * 84, dtype=np.uint8).reshape(3, 84, 84))
    columns = {"obs": frames, "action": np.array([1, 2, 3]), "mask": np.array([True, False, True])}
    priorities = np.array([0.5, 1.0, 2.0])
    copied, copied_priorities = memory.off_heap(columns, priorities)
    np.testing.assert_array_equal(copied["action"], columns["action"])
    np.testing.assert_array_equal(copied["mask"], columns["mask"])
    np.testing.assert_array_equal(copied_priorities, priorities)
    assert not np.shares_memory(copied["action"], columns["action"])
    np.testing.assert_array_equal(codec.decompress(copied["obs"])[0], codec.decompress(frames)[0])
    assert tensors.to_proto(copied["obs"]) == tensors.to_proto(frames)
