"""Aggregate insert and sample rates with 1, 2 and 4 replay shards, through the shipping clients.

    .venv/bin/python benchmarks/shards.py                       # 1, 2, 4 shards, 3 x 20 s each
    .venv/bin/python benchmarks/shards.py --shards 1 2 --seconds 10 --repeats 1

Each shard is an `apexrl replay` process on loopback (capacity 200,000 / N each, min size 1,000
/ N, no rate-limiter ratio). Workers are spawned processes, each with the client the services
build from the `replay` setting (`apexrl.replay.sharded.connect`: a ReplayClient for one
address, a ShardedReplayClient for several): `--writers` actors inserting 64 CartPole
transitions per call (the actor's insert_batch), and one learner-like sampler drawing batches
of 256 (the learner's batch_size) and writing their priorities back. Figures: inserted and
sampled items/s over the measured window (after a warm-up that fills every shard past its
minimum), medians over repeats, the load average alongside. stdout: one JSON object.

On this 2-core machine every shard, writer and sampler shares the same two cores, so more
shards cannot add CPU: the figures show the clients' overhead of splitting and merging more
than any gain. The gain needs a core or more per shard: run it on a machine that has them.
"""

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from replay_throughput import log, server_process  # noqa: E402


def cartpole(n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    obs = rng.standard_normal((n, 4)).astype(np.float32)
    return {
        "obs": obs,
        "action": rng.integers(0, 2, n),
        "reward": np.ones(n, np.float32),
        "discount": np.full(n, 0.97, np.float32),
        "next_obs": obs + np.float32(0.01),
    }


def _worker(role: str, address: str, start, stop, results) -> None:
    from apexrl.replay.sharded import connect

    rng = np.random.default_rng(os.getpid())
    done = 0
    with connect(address, timeout=30.0, retry_seconds=10.0) as client:
        items = cartpole(64, rng)
        if role == "writer":
            client.insert(items, rng.random(64) + 0.1)  # warm: streams open
        start.wait()
        while not stop.is_set():
            if role == "writer":
                client.insert(items, rng.random(64) + 0.1)
                done += 64
            else:
                batch = client.sample(256, 0.4)
                client.update_priorities(batch.keys, rng.random(256) + 0.1)
                done += 256
    results.put((role, done))


def replay_command(shard: int, shards: int) -> list[str]:
    command = [sys.executable, "-m", "apexrl.cli", "replay", "--host", "127.0.0.1", "--port", "0"]
    command += ["--metrics-port", "0", "--capacity", str(200_000 // shards)]
    command += ["--min-size-to-sample", str(1000 // shards), "--shard", str(shard)]
    return command + ["--grace-seconds", "2", "--log-level", "WARNING"]


def measure(shards: int, writers: int, seconds: float, workdir: Path) -> dict:
    ctx = mp.get_context("spawn")
    with ExitStack() as stack:
        servers = [
            stack.enter_context(
                server_process(f"shard{shards}-{i}", replay_command(i, shards), workdir)
            )
            for i in range(shards)
        ]
        address = ",".join(s.address for s in servers)
        start, stop, results = ctx.Event(), ctx.Event(), ctx.Queue()
        roles = ["writer"] * writers + ["sampler"]
        procs = [
            ctx.Process(target=_worker, args=(r, address, start, stop, results)) for r in roles
        ]
        for p in procs:
            p.start()
        # Fill every shard past its minimum before the clock starts.
        from apexrl.replay.sharded import connect

        with connect(address, timeout=30.0) as client:
            rng = np.random.default_rng(0)
            for _ in range(32):  # 2,048 items: twice the minimum, spread over the shards
                client.insert(cartpole(64, rng))
        start.set()
        t0 = time.perf_counter()
        time.sleep(seconds)
        stop.set()
        elapsed = time.perf_counter() - t0
        counts = {"writer": 0, "sampler": 0}
        for _ in procs:
            role, done = results.get(timeout=60)
            counts[role] += done
        for p in procs:
            p.join(30)
    return {
        "inserted_per_s": counts["writer"] / elapsed,
        "sampled_per_s": counts["sampler"] / elapsed,
        "load_1min": os.getloadavg()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    report: dict = {"writers": args.writers, "seconds": args.seconds, "cores": os.cpu_count()}
    with tempfile.TemporaryDirectory() as tmp:
        runs: dict[int, list[dict]] = {n: [] for n in args.shards}
        for repeat in range(args.repeats):  # interleaved, so drift in load hits every count
            for n in args.shards:
                run = measure(n, args.writers, args.seconds, Path(tmp))
                log(f"repeat {repeat + 1}, {n} shard(s): {json.dumps(run)}")
                runs[n].append(run)
    report["shards"] = {
        n: {
            "inserted_per_s": statistics.median(r["inserted_per_s"] for r in rs),
            "sampled_per_s": statistics.median(r["sampled_per_s"] for r in rs),
            "runs": rs,
        }
        for n, rs in runs.items()
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
