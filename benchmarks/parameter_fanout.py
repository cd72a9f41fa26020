"""What one parameter pull costs the learner: CPU seconds of a real `apexrl learner` process per
GetParameters answer, the whole Atari network each time.

    .venv/bin/python benchmarks/parameter_fanout.py --callers 16 --seconds 20

The learner (dqn, ALE/Pong-v5, its 6.75 MB network) runs pinned to core 0 with no replay to
train from: it publishes version 1 at start and serves it, its training thread waiting for a
replay that never answers (a reconnect attempt now and then). `--callers` pullers, threads in
4 spawned processes pinned to the other core(s), each with its own LearnerClient (own channel
and connection), pull back to back as a new actor does (have_version 0: the whole version).
Over the window: the learner's CPU seconds (utime + stime, all threads) per pull and the
kernel's share of them (stime: on loopback the kernel's TCP work for both ends of a
connection mostly lands on the sender), pulls/s and the bytes/s they carried; 1 / cpu_per_pull_s is how many whole pulls one learner core could
answer and do nothing else. The last line is one JSON object.
"""

import argparse
import json
import multiprocessing as mp
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

from scale_actors import OWN
from scale_services import cpu_times, scrape, service

from apexrl.common.learner_client import LearnerClient


def _pull(address: str, threads: int, options, ready, start, stop, counts, slot: int) -> None:
    done = [0] * threads

    def loop(i: int) -> None:
        with LearnerClient(address, timeout=60.0, channel_options=OWN + options) as client:
            client.get_parameters()
            ready.release()
            start.wait()
            while not stop.is_set():
                client.get_parameters()
                done[i] += 1

    workers = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    while not stop.wait(0.2):
        counts[slot] = sum(done)
    for w in workers:
        w.join(120)
    counts[slot] = sum(done)


def measure(callers: int, seconds: float, folder: Path, options: tuple = ()) -> dict:
    """options: more channel arguments for the callers' channels, (name, value) pairs."""
    cores = sorted(os.sched_getaffinity(0))
    learner_core = cores[0] if len(cores) >= 2 else None
    if learner_core is not None:
        os.sched_setaffinity(0, set(cores[1:]))
    command = ["learner", "--env", "ALE/Pong-v5", "--device", "cpu", "--replay", "127.0.0.1:9"]
    with service("learner", command, folder, learner_core) as learner:
        ctx = mp.get_context("spawn")
        ready, start, stop, counts = ctx.Semaphore(0), ctx.Event(), ctx.Event(), ctx.Array("q", 4)
        shares = [callers // 4 + (k < callers % 4) for k in range(4)]
        procs = [
            ctx.Process(
                target=_pull, args=(learner.address, n, options, ready, start, stop, counts, k)
            )
            for k, n in enumerate(shares)
            if n
        ]
        for p in procs:
            p.start()
        for _ in range(callers):  # every caller has pulled once
            if not ready.acquire(timeout=300):
                raise RuntimeError("the callers did not start")
        start.set()
        whole = scrape(learner.metrics_port)["apexrl_learner_parameter_bytes"]
        t0, cpu0, pulls0 = time.monotonic(), cpu_times(learner.process.pid), sum(counts)
        time.sleep(seconds)
        t1, cpu1, pulls1 = time.monotonic(), cpu_times(learner.process.pid), sum(counts)
        stop.set()
        for p in procs:
            p.join(120)
    pulls, elapsed = pulls1 - pulls0, t1 - t0
    user, system = (b - a for a, b in zip(cpu0, cpu1, strict=True))
    per_pull = (user + system) / max(pulls, 1)
    return {
        "callers": callers,
        "client_options": dict(options),
        "pulls_per_s": round(pulls / elapsed, 1),
        "parameter_bytes_per_s": round(pulls * whole / elapsed),
        "learner_cpu_per_s": round((user + system) / elapsed, 3),
        "learner_system_share": round(system / max(user + system, 1e-9), 3),
        "cpu_per_pull_s": round(per_pull, 5),
        "whole_pulls_per_core_s": round(1 / per_pull, 1) if per_pull else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--callers", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument(
        "--client-option",
        action="append",
        default=[],
        metavar="NAME=INT",
        help="a gRPC channel argument for the callers, e.g. grpc.http2.max_frame_size=16777215",
    )
    args = parser.parse_args()
    options = tuple((n, int(v)) for n, _, v in (o.partition("=") for o in args.client_option))
    with tempfile.TemporaryDirectory(prefix="apexrl-fanout-") as folder:
        report = measure(args.callers, args.seconds, Path(folder), options)
    print(json.dumps(report), flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
