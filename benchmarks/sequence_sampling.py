"""Sequence sampling against the table's size: R2D2's items in its prioritized table holding 10K
and then 1M sequences, 64 sequences a call through the shipping client.

    .venv/bin/python benchmarks/sequence_sampling.py                  # 10K and 1M, masked CartPole
    .venv/bin/python benchmarks/sequence_sampling.py --sizes 10000 100000 1000000 --calls 500

One `apexrl replay` process (port 0) serving r2d2's table for the env exactly as local mode
declares it (`apexrl.local.settings.replay_tables`: signature, prioritized sampler, alpha 0.9, FIFO
remover), but with the largest size as capacity and no sampling ratio, so it neither evicts
nor waits. It is filled with random sequences of the signature's shapes, random priorities, 1,000
a call (ReplayClient.insert), up to each size in turn; at each size ReplayClient.sample(64)
runs `--calls` times back to back. Prints per size the median and p90 of a call and the
replay's RSS, then the largest size's median over the smallest's. Figures, never pass/fail.
"""

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from replay_throughput import server_process

from apexrl import algorithms
from apexrl.local.settings import dump_toml, parse, replay_tables
from apexrl.replay.client import ReplayClient

INSERT_BATCH = 1000


def table_config(env: str, capacity: int) -> tuple[dict, list]:
    config = parse(["--algorithm", "r2d2", "--env", env])
    (table,) = replay_tables(config, shards=1)
    table |= {"capacity": capacity, "min_size_to_sample": 1, "samples_per_insert": 0.0,
              "error_buffer": 0.0}  # fmt: skip
    return table, algorithms.transition_columns(config)


def random_items(columns, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    items = {}
    for column in columns:
        shape = (n, *column.shape)
        if np.issubdtype(column.dtype, np.integer):
            items[column.name] = rng.integers(0, 2, size=shape).astype(column.dtype)
        else:
            items[column.name] = rng.standard_normal(shape).astype(column.dtype)
    return items


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--env", default="apexrl/CartPoleNoVelocity-v1")
    p.add_argument("--sizes", type=int, nargs="+", default=[10_000, 1_000_000])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--calls", type=int, default=300)
    args = p.parse_args()
    sizes = sorted(args.sizes)
    table, columns = table_config(args.env, sizes[-1])
    rng = np.random.default_rng(0)
    block = random_items(columns, INSERT_BATCH, rng)  # the same rows, fresh priorities each call
    results = []
    with tempfile.TemporaryDirectory(prefix="sequence-sampling-") as tmp:
        config = Path(tmp) / "replay.toml"
        config.write_text(dump_toml({"replay": {"tables": [table]}}))
        command = [sys.executable, "-m", "apexrl.cli", "replay", "--config", str(config),
                   "--host", "127.0.0.1", "--port", "0", "--metrics-port", "0",
                   "--max-message-mb", "256", "--log-level", "WARNING"]  # fmt: skip
        with (
            server_process("replay", command, Path(tmp)) as server,
            ReplayClient(server.address, timeout=120) as client,
        ):
            held = 0
            for size in sizes:
                while held < size:
                    client.insert(block, rng.uniform(0.01, 10.0, INSERT_BATCH))
                    held += INSERT_BATCH
                client.sample(args.batch)  # warm
                times = []
                for _ in range(args.calls):
                    started = time.perf_counter()
                    client.sample(args.batch)
                    times.append(time.perf_counter() - started)
                times.sort()
                results.append({
                    "table_size": client.info().size,
                    "batch": args.batch, "calls": args.calls,
                    "median_ms": round(1e3 * statistics.median(times), 3),
                    "p90_ms": round(1e3 * times[int(0.9 * len(times))], 3),
                    "replay_rss_mb": round(rss_mb(server.process.pid), 1),
                })  # fmt: skip
                print(json.dumps(results[-1]), flush=True)
    ratio = results[-1]["median_ms"] / results[0]["median_ms"]
    print(json.dumps({"env": args.env, "signature": table["signature"],
                      "largest_over_smallest_median": round(ratio, 3)}))  # fmt: skip


if __name__ == "__main__":
    main()
