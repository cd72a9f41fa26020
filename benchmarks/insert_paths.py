"""Insert and priority paths side by side, through the shipping clients, against one replay.

    .venv/bin/python benchmarks/insert_paths.py [--seconds 3] [--repeats 3]
                                                [--paths inserts,writers,priorities]
                                                [--reverb ~/reverb-venv/bin/python]

One `apexrl replay` process (capacity 1M), CartPole-size transitions (obs f32[4], action i64,
reward f32, discount f32, next_obs f32[4]); medians of the repeats, every path in each repeat.

inserts (items/s, one writer in this process): the shipping ReplayClient.insert (one
long-lived stream) against a stream opened per call (what ReplayClient did before) and a raw
stream (the ceiling), at 1 and 64 per call; and one transition at a time through
ReplayClient.writer, confirming (flush) every 64 as Reverb's writers do.

writers (items/s): 4 writer processes, each its own ReplayClient inserting 64 per call, the
aggregate over the same window.

priorities (priorities/s, keys of live items, float32 priorities):
- update_priorities_512: ReplayClient.update_priorities, 512 keys a call, one call at a time
  (each sent on the client's long-lived UpdatePrioritiesStream and waited for);
- learner_priorities_512: the learner's own sender (learner.write_back.write_priorities, as
  Learner._write_priorities runs it: coalesced and pipelined) writing 512-key updates that a
  producer keeps queued, as a learner faster than the replay would;
- unary_ceiling_calls: a trivial unary call (health Check) on the same replay, one at a time:
  the ceiling of any one-call-at-a-time path on the replay (x512: unary_ceiling_512, in
  priorities/s);
- raw_ceiling_calls: the RAW ceiling, not a replay figure: a bare grpc.aio server (no
  interceptors, no (de)serializers; replay_throughput.py --serve-echo) echoing 64 bytes to a
  plain channel, one call at a time (x512: raw_ceiling_512). What Python gRPC itself allows
  for unary calls;
- raw_stream_ceiling_calls: the same server's bare bidi stream, 64 bytes sent and one byte
  answered, one at a time (x512: raw_stream_ceiling_512): the RAW ceiling of a stream;
- reverb_mutate_512 (only with --reverb PYTHON, a Python with dm-reverb 0.14): DeepMind
  Reverb's Client.mutate_priorities, 512 distinct live keys a call, one call at a time, for
  --seconds, against its own Reverb server (one table, Prioritized(0.6), Fifo, MinSize(1),
  max_size 1M) holding 200K CartPole-size items: `PYTHON reverb_side.py --priorities SECONDS
  --repeats 1` (its docstring has the details), run once per repeat right after apexrl's
  priority paths, so the two alternate within one run. Its run lines are printed as they come.
update_over_X = update_priorities_512 / X_512 (of the medians): update_over_reverb above 1
means ReplayClient.update_priorities moves more priorities/s than Reverb's mutate_priorities.
The last line is one JSON object.
"""

import argparse
import json
import multiprocessing as mp
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path

import grpc
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from atari import start_replay  # noqa: E402  (benchmarks/ is not a package)
from replay_throughput import ECHO_SERVICE, echo_server  # noqa: E402

from apexrl.replay.client import STREAM_SECONDS, ReplayClient, insert_request  # noqa: E402

PATHS = ("inserts", "writers", "priorities")
REVERB_SIDE = Path(__file__).resolve().parent / "reverb_side.py"
CAPACITY = 1_000_000
WRITERS = 4


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


# --- inserts ------------------------------------------------------------------------------


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


def insert_paths(client: ReplayClient, seconds: float) -> dict[str, float]:
    figures = {"writer_1_flush_64": writer_flush_64(client, 1, seconds)}
    for n in (1, 64):
        for name, path in (("shipping", shipping), ("stream_per_call", stream_per_call),
                           ("raw_stream_ceiling", raw_stream)):  # fmt: skip
            figures[f"{name}_{n}"] = path(client, n, seconds)
    return figures


# --- writer processes ---------------------------------------------------------------------


def _writer(address: str, start, stop, counts, index: int) -> None:
    with ReplayClient(address, retry_seconds=0) as client:
        batch = transitions(64)
        client.insert(batch)  # connected before the clock starts
        start.wait()
        inserted = 0
        while not stop.is_set():
            client.insert(batch)
            inserted += 64
            counts[index] = inserted


def writer_processes(address: str, writers: int, seconds: float) -> float:
    """Aggregate items/s of `writers` processes inserting 64 per call at once."""
    ctx = mp.get_context("spawn")  # no fork: this process already runs gRPC
    start, stop = ctx.Event(), ctx.Event()
    counts = ctx.Array("q", writers)
    procs = [ctx.Process(target=_writer, args=(address, start, stop, counts, i))
             for i in range(writers)]  # fmt: skip
    for p in procs:
        p.start()
    time.sleep(4)  # spawn and imports
    start.set()
    time.sleep(0.5)  # every writer under way
    begin, t0 = sum(counts), time.perf_counter()
    time.sleep(seconds)
    end, elapsed = sum(counts), time.perf_counter() - t0
    stop.set()
    for p in procs:
        p.join(60)
    return (end - begin) / elapsed


# --- priorities ---------------------------------------------------------------------------


def live_updates(client: ReplayClient, count: int, n: int = 512) -> list[tuple]:
    """`count` updates of n keys of stored items (the table filled first if it holds < 200K)."""
    info = client.info()
    batch = transitions(10_000)
    while info.size < 200_000:
        client.insert(batch)
        info = client.info()
    rng = np.random.default_rng(0)
    newest = info.inserts - 1
    return [
        (newest - rng.integers(0, info.size, n), (rng.random(n) * 2).astype(np.float32))
        for _ in range(count)
    ]


def update_priorities_512(client: ReplayClient, updates: list[tuple], seconds: float) -> float:
    calls, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        keys, priorities = updates[calls % len(updates)]
        client.update_priorities(keys, priorities)
        calls += 1
    return calls * 512 / (time.perf_counter() - started)


def unary_ceiling(client: ReplayClient, seconds: float) -> float:
    """Calls/s of a trivial unary call (health Check, through the same server and channel)."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    stub, request = health_pb2_grpc.HealthStub(client.channel), health_pb2.HealthCheckRequest()
    return rate(lambda: stub.Check(request, timeout=client.timeout), 1, seconds)


def raw_ceiling(address: str, seconds: float) -> float:
    """Calls/s of a 64-byte echo on the bare echo server through a plain channel."""
    with grpc.insecure_channel(address) as channel:
        echo, payload = channel.unary_unary(f"/{ECHO_SERVICE}/Echo"), bytes(64)
        echo(payload, timeout=30)  # connected before the clock starts
        return rate(lambda: echo(payload, timeout=30), 1, seconds)


def raw_stream_ceiling(address: str, seconds: float) -> float:
    """Round trips/s of 64 bytes on one bare bidi stream (the echo server's Upload), one
    message at a time: the RAW ceiling of a path over a long-lived stream."""
    with grpc.insecure_channel(address) as channel:
        messages: queue.SimpleQueue = queue.SimpleQueue()
        call = channel.stream_stream(f"/{ECHO_SERVICE}/Upload")(
            iter(messages.get, None), timeout=STREAM_SECONDS
        )

        def one() -> None:
            messages.put(bytes(64))
            next(call)

        result = rate(one, 1, seconds)
        messages.put(None)
        list(call)
        return result


def learner_priorities(
    client: ReplayClient, updates: list[tuple], seconds: float, senders: int
) -> tuple[float, bool]:
    """Priorities/s through the learner's sender with updates always queued; and whether the
    replay counted every one of them."""
    from apexrl.learner.write_back import COALESCE, write_priorities

    queued: queue.Queue = queue.Queue()
    stop, done = threading.Event(), threading.Event()
    sent = [0]

    def produce() -> None:
        i = 0
        while not done.is_set():
            if queued.qsize() < 4 * COALESCE * senders:
                queued.put(updates[i % len(updates)])
                i += 1
            else:
                time.sleep(0.001)
        queued.put(None)

    def count(n: int) -> None:
        sent[0] += n  # under the GIL; one += at a time is enough for a benchmark count

    before = client.info()
    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    timer = threading.Timer(seconds, done.set)
    started = time.perf_counter()
    timer.start()
    write_priorities(client, queued, stop, count, coalesce=COALESCE, senders=senders)
    elapsed = time.perf_counter() - started
    producer.join()
    after = client.info()
    landed = (after.priority_updates + after.stale_priority_updates) - (
        before.priority_updates + before.stale_priority_updates
    )
    return sent[0] / elapsed, landed == sent[0]


def priority_paths(
    client: ReplayClient, echo_address: str, seconds: float, senders: int
) -> dict[str, float]:
    updates = live_updates(client, 256)
    raw = raw_ceiling(echo_address, seconds)
    raw_stream_calls = raw_stream_ceiling(echo_address, seconds)
    calls = unary_ceiling(client, seconds)
    one_at_a_time = update_priorities_512(client, updates, seconds)
    learner, all_landed = learner_priorities(client, updates, seconds, senders)
    if not all_landed:
        raise RuntimeError("the replay counted fewer priority updates than the learner sent")
    return {
        "raw_ceiling_calls": raw,
        "raw_ceiling_512": raw * 512,
        "raw_stream_ceiling_calls": raw_stream_calls,
        "raw_stream_ceiling_512": raw_stream_calls * 512,
        "unary_ceiling_calls": calls,
        "unary_ceiling_512": calls * 512,
        "update_priorities_512": one_at_a_time,
        "learner_priorities_512": learner,
    }


def reverb_mutate(python: str, seconds: float, seed: int) -> float:
    """Priorities/s of Reverb's Client.mutate_priorities, 512 keys a call: one repeat of
    reverb_side.py --priorities under `python` (its own Reverb server, filled, then measured)."""
    command = [python, str(REVERB_SIDE), "--priorities", str(seconds), "--repeats", "1",
               "--seed", str(seed)]  # fmt: skip
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    env.pop("PYTHONPATH", None)
    done = subprocess.run(
        command, stdout=subprocess.PIPE, text=True, env=env, check=True, timeout=900
    )
    lines = done.stdout.strip().splitlines()
    for line in lines[:-1]:
        print(line, flush=True)
    return json.loads(lines[-1])["mutate_priorities_512_median"]


def main() -> None:
    from apexrl.learner.write_back import SENDERS

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--paths", default=",".join(PATHS), help=f"some of {', '.join(PATHS)}")
    parser.add_argument("--senders", type=int, default=SENDERS,
                        help="priority calls in flight on the learner's path")  # fmt: skip
    parser.add_argument("--reverb", default="", metavar="PYTHON",
                        help="a Python with dm-reverb: also measure Reverb's mutate_priorities "
                             "(priorities path; default: skip)")  # fmt: skip
    args = parser.parse_args()
    paths = args.paths.split(",")
    if not set(paths) <= set(PATHS):
        parser.error(f"--paths: {args.paths!r} is not a list of {PATHS}")

    workdir = Path(tempfile.mkdtemp())
    process, address = start_replay("CartPole-v1", CAPACITY, workdir)
    runs: dict[str, list[float]] = {}
    try:
        with ExitStack() as stack:
            client = stack.enter_context(ReplayClient(address))
            if "priorities" in paths:
                echo_address = stack.enter_context(echo_server(workdir)).address
            for repeat in range(args.repeats):
                figures: dict[str, float] = {}
                if "inserts" in paths:
                    figures |= insert_paths(client, args.seconds)
                if "writers" in paths:
                    figures[f"writers_{WRITERS}_64"] = writer_processes(
                        address, WRITERS, args.seconds
                    )
                if "priorities" in paths:
                    figures |= priority_paths(client, echo_address, args.seconds, args.senders)
                    if args.reverb:
                        figures["reverb_mutate_512"] = reverb_mutate(
                            args.reverb, args.seconds, repeat
                        )
                for name, value in figures.items():
                    runs.setdefault(name, []).append(value)
    finally:
        process.terminate()
        process.wait(30)
    figures = {k: round(statistics.median(v)) for k, v in runs.items()}
    if "inserts" in paths:
        for n in (1, 64):
            figures[f"shipping_over_stream_per_call_{n}"] = round(
                figures[f"shipping_{n}"] / figures[f"stream_per_call_{n}"], 2
            )
    if "priorities" in paths:
        for ceiling in ("unary_ceiling", "raw_ceiling", "raw_stream_ceiling"):
            figures[f"update_over_{ceiling}"] = round(
                figures["update_priorities_512"] / figures[f"{ceiling}_512"], 2
            )
        if args.reverb:
            figures["update_over_reverb"] = round(
                figures["update_priorities_512"] / figures["reverb_mutate_512"], 2
            )
    print(json.dumps({"runs": {k: [round(x) for x in v] for k, v in runs.items()}}))
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
