"""Insert paths side by side: the shipping ReplayClient.insert (one long-lived stream) against a
stream opened per call (what ReplayClient did before) and a raw stream (the ceiling); and one
transition at a time through ReplayClient.writer, confirming (flush) every 64 as Reverb's
writers do.

    .venv/bin/python benchmarks/insert_paths.py [--seconds 3] [--repeats 3]

One `apexrl replay` process, one writer in this process, CartPole-size transitions (obs f32[4],
action i64, reward f32, discount f32, next_obs f32[4]) at 1 and 64 per call; items/s, median
of the repeats, all paths in the same run. The last line is one JSON object.
"""

import argparse
import json
import queue
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from atari import start_replay  # noqa: E402  (benchmarks/ is not a package)

from apexrl.replay.client import STREAM_SECONDS, ReplayClient, insert_request  # noqa: E402


def transitions(n: int) -> dict[str, np.ndarray]:
    return {"obs": np.zeros((n, 4), np.float32), "action": np.zeros(n, np.int64),
            "reward": np.zeros(n, np.float32), "discount": np.ones(n, np.float32),
            "next_obs": np.zeros((n, 4), np.float32)}  # fmt: skip


def rate(call, n: int, seconds: float) -> float:
    calls, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        call()
        calls += 1
    return calls * n / (time.perf_counter() - started)


def shipping(client: ReplayClient, n: int, seconds: float) -> float:
    batch = transitions(n)
    return rate(lambda: client.insert(batch), n, seconds)


def writer_flush_64(client: ReplayClient, n: int, seconds: float) -> float:
    """One transition per append (n is ignored), flush (wait for the acks) every 64."""
    rows = transitions(64)
    items = [{k: v[i] for k, v in rows.items()} for i in range(64)]
    writer = client.writer(batch=64)

    def sixty_four() -> None:
        for item in items:
            writer.append(item, 1.0)
        writer.flush()

    try:
        return rate(sixty_four, 64, seconds)
    finally:
        writer.close()


def stream_per_call(client: ReplayClient, n: int, seconds: float) -> float:
    request = insert_request(client.table, transitions(n), None)
    return rate(lambda: list(client.stub.Insert(iter([request]), timeout=30)), n, seconds)


def raw_stream(client: ReplayClient, n: int, seconds: float) -> float:
    """The ceiling: one stream, send and wait for each ack, no client around it."""
    request = insert_request(client.table, transitions(n), None)
    requests: queue.SimpleQueue = queue.SimpleQueue()
    call = client.stub.Insert(iter(requests.get, None), timeout=STREAM_SECONDS)

    def one() -> None:
        requests.put(request)
        next(call)

    result = rate(one, n, seconds)
    requests.put(None)
    list(call)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    import tempfile

    process, address = start_replay("CartPole-v1", 1_000_000, Path(tempfile.mkdtemp()))
    runs: dict[str, list[float]] = {}
    try:
        with ReplayClient(address) as client:
            for _ in range(args.repeats):
                runs.setdefault("writer_1_flush_64", []).append(
                    writer_flush_64(client, 1, args.seconds)
                )
                for n in (1, 64):
                    for name, path in (("shipping", shipping), ("stream_per_call", stream_per_call),
                                       ("raw_stream_ceiling", raw_stream)):  # fmt: skip
                        runs.setdefault(f"{name}_{n}", []).append(path(client, n, args.seconds))
    finally:
        process.terminate()
        process.wait(30)
    figures = {k: round(statistics.median(v)) for k, v in runs.items()}
    for n in (1, 64):
        figures[f"shipping_over_stream_per_call_{n}"] = round(
            figures[f"shipping_{n}"] / figures[f"stream_per_call_{n}"], 2
        )
    print(json.dumps({"runs": {k: [round(x) for x in v] for k, v in runs.items()}}))
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
