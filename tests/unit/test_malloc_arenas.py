"""A service process keeps glibc's malloc to two arenas (apexrl.cli): with one per thread a
learner's heaps kept growing for its first 20 minutes, which the soak's resource check reads
as a leak."""

import os
import subprocess
import sys

import pytest

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
