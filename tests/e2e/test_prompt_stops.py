"""Every service of every algorithm stops promptly on SIGTERM: what nothing needs finished (a
sample a queue's rate limiter holds, a long poll for parameters, a prefetch) is cancelled,
not waited for; what must finish (the learner's final checkpoint) still does. On the way,
a queue table's books are checked: with its writers and reader stopped, samples == inserts -
size (each unroll sampled once, none twice).

The services run as local mode runs them (its Run: the same config file, entry points and
processes), training, and are stopped in the ORDERS below, each one's exit timed from its
SIGTERM. ppo's learner used to take its whole 10 s grace in local mode's order (its
priority writer waited for a batch that never came).

Each run stops at a moment of its own; `benchmarks/stop_repeat.py` repeats this test many
times per algorithm and counts the exits that were not 0 and the stops that were slow.
"""

import random
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from apexrl import algorithms
from apexrl.common import checkpoint
from apexrl.local.settings import parse
from apexrl.local.supervision import Run
from apexrl.replay.client import ReplayClient
from tests.conftest import wait_for

pytestmark = pytest.mark.slow

# Seconds from SIGTERM to exit: 1 s, and for the learner 1 s more for what it must finish (its
# final checkpoint). Nothing else is waited for: a stopped service exits without the
# interpreter's teardown (cli.py), clients do not retry once their process stops, long polls
# and evaluation rounds are cancelled (common/backoff.py, common/learner_client.py,
# algorithms/evaluation.py), an actor's buffered inserts get 0.3 s to land and are dropped
# if replay's rate limiter holds them (actor/loop.py), /metrics stops without waiting for its
# poll loop (common/metrics_http.py), and a server ends the calls whose handlers are done but
# whose answers wait for a peer that does not read (common/serving.py: stop_server). On an
# otherwise idle 2-core machine the 64 exits of this file took 0.01-0.57 s, the learners'
# 0.06-0.57 s (`pytest -s tests/e2e/test_prompt_stops.py`); nec's actor took 3.3 s before
# (its inserts held by the rate limiter at 16 samples per insert, waited for up to 5 s).
BOUND = 1.0
LEARNER_BOUND = 2.0

# Every registered algorithm (a test below keeps this list whole).
ENVS = {"dqn": "CartPole-v1", "rainbow": "CartPole-v1", "nec": "CartPole-v1",
        "r2d2": "CartPole-v1", "dpg": "Pendulum-v1", "impala": "CartPole-v1",
        "ppo": "CartPole-v1", "unreal": "CartPole-v1", "reinforce": "CartPole-v1", "a3c": "CartPole-v1"}  # fmt: skip


def stop_timed(children: list) -> dict[str, tuple[float, int]]:
    """SIGTERM to each child at once; (seconds to exit, exit code) by name, each exit waited
    for in a thread of its own (a slow one does not add to the times of those after it)."""
    sent = {}
    for child in children:
        sent[child.name] = time.monotonic()
        child.process.send_signal(signal.SIGTERM)

    def wait(child) -> tuple[float, int]:
        try:
            code = child.process.wait(30)
        except subprocess.TimeoutExpired:
            child.process.kill()
            code = child.process.wait()
        return time.monotonic() - sent[child.name], code

    with ThreadPoolExecutor(len(children)) as pool:
        return dict(zip([c.name for c in children], pool.map(wait, children), strict=True))


def queue_books(run) -> tuple[int, int, int] | None:
    """(inserts, samples, size) of the replay's queue table if it has one, else None."""
    queues = [t for t in run.settings["replay"]["tables"] if t["rate_limiter"] == "queue"]
    if not queues:
        return None
    (table,) = queues
    replay = next(c for c in run.children if c.name == "replay")
    address = f"127.0.0.1:{replay.ports['port']}"
    with ReplayClient(address, table=table["name"], timeout=10, retry_seconds=5) as client:
        info = client.info()
    return info.inserts, info.samples, info.size


# Local mode's order: actors and evaluator, then the learner, then the replay (each stop has
# its peers' calls ended already). Then the reverse, one service at a time with the others
# still running, as a rolling restart does: the replay with actors and a learner connected,
# the learner with its replay gone, the actor with both gone.
ORDERS = {
    "local": [["actor-0", "evaluator"], ["learner"], ["replay"]],
    "alone": [["replay"], ["learner"], ["actor-0"], ["evaluator"]],
}


@pytest.mark.parametrize("order", sorted(ORDERS))
@pytest.mark.parametrize("algorithm", sorted(ENVS))
def test_every_service_stops_within_seconds_of_sigterm(tmp_path, algorithm, order):
    config = parse(["--algorithm", algorithm, "--env", ENVS[algorithm], "--actors", "1",
                          "--run-dir", str(tmp_path / "run"), "--seed", "1"])  # fmt: skip
    run = Run(config, {}, tmp_path / "run")
    books = None
    try:
        run.start_all()
        run.start_evaluator()  # as local mode starts it, once the others serve
        by_name = {c.name: c for c in run.children}
        # The stop comes at a moment of its own each run: after 3 to 12 updates, wherever
        # each service then is (a sample, an insert, a priority write, a pull in flight).
        updates = random.randint(3, 12)
        wait_for(
            lambda: (
                by_name["learner"].metrics().get("apexrl_learner_updates_total", 0) >= updates
                and by_name["evaluator"].metrics().get("apexrl_evaluation_rounds_total", 0) >= 1
            ),
            120,
            f"{algorithm}: updates and an evaluation",
        )
        trained = by_name["learner"].metrics()["apexrl_learner_update_step"]
        times = {}
        for names in ORDERS[order]:
            if names == ["replay"] and order == "local":
                books = queue_books(run)
            times |= stop_timed([by_name[name] for name in names])
    finally:
        for child in run.children:
            if child.process.poll() is None:
                child.process.kill()
                child.process.wait()
    print(algorithm, order, {name: f"{seconds:.2f} s" for name, (seconds, _) in times.items()})
    for name, (seconds, code) in times.items():
        log = (tmp_path / "run" / "logs" / f"{name}.log").read_text()
        assert code == 0, f"{algorithm} {name} exited {code}:\n{log[-2000:]}"
        bound = LEARNER_BOUND if name == "learner" else BOUND
        assert seconds < bound, f"{algorithm} {name} took {seconds:.2f} s to stop:\n{log[-2000:]}"
    if books is not None:  # a queue: every unroll that left it was sampled exactly once
        inserts, samples, size = books
        assert samples > 0 and samples == inserts - size, books
    # The learner's final checkpoint was written on the way out: the only one (local mode
    # checkpoints at exit only), holding at least the updates seen before the SIGTERM.
    _, meta, _ = checkpoint.load_newest(run.checkpoint_dir, "learner")
    assert meta["algorithm"] == algorithm and meta["update_step"] >= trained


def test_every_registered_algorithm_is_stopped_above():
    assert set(ENVS) == set(algorithms.ALGORITHMS)
