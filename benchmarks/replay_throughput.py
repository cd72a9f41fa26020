"""Replay service throughput over loopback gRPC, next to a raw gRPC ceiling. Figures, never pass/fail.

    .venv/bin/python benchmarks/replay_throughput.py --repeats 3     # the real run (~3 min)
    .venv/bin/python benchmarks/replay_throughput.py --quick         # smoke run (~15 s)

Every server runs in its own process on 127.0.0.1 (port 0, ready file): two `apexrl replay`
servers (`python -m apexrl.cli replay`) and a bytes echo server (this file, `--serve-echo`:
grpc.aio with a generic handler and no (de)serializers, the same message size options).
Each repeat measures, in this order, so every figure has a ceiling taken minutes apart at most:

- ceiling: unary echo calls/s at 64 B (1 call in flight, and UPDATE_WINDOW in flight) and at
  1 MiB (MB/s counts the payload one way); a one-way upload stream (client streams, the server
  acks each message with 1 byte, INSERT_WINDOW unacknowledged) at 64 B and 1 MiB, as inserts
  are mostly one-way; a one-way unary download (8-byte request, 1 MiB or 32 MiB response),
  the shape of Sample (32 or 512 Atari items are 1.8 MB or 28.9 MB).
- W1, CartPole-sized transitions (obs f32[4], action i64, reward f32, discount f32, next_obs
  f32[4], plus f32 priorities), table capacity 2^20: insert items/s on one long-lived Insert
  stream per writer (INSERT_WINDOW requests unacknowledged) with 1 and 4 writer processes
  (spawned; channels made in the children), and with ReplayClient.insert (one stream per
  call, what the shipping client does); sample items/s at 512 (unary ReplayClient.sample and
  the server-streamed sample_stream, decoding included); priority updates/s at 512 and 4,096
  keys per call (keys from real samples, UPDATE_WINDOW calls in flight via .future()).
- W2, Atari-sized transitions: obs / next_obs uint8[84, 84, 4] stacked from real ALE Pong
  frames (random policy, 210x160 index-sampled to 84x84, a pool collected once and cycled),
  table capacity 50,000, filled once before the repeats (`w2_fill_mb_per_s`: the first write
  of every page); then per repeat, on the full table: insert items/s and MB/s (one writer
  process, w2_insert_batch items per message, about the ceiling's 1 MiB; inserts overwrite
  the oldest items), sample items/s and MB/s at batch 32 and 512, and server RSS per stored
  item ((RSS now - RSS of the empty server) / capacity, psutil) next to the raw item size.

Output (stdout): one JSON line per workload (medians over the repeats, and every repeat under
"runs"), then one JSON object with every figure under stable keys, the targets and whether
each is met (printed, never asserted), the settings and the machine's load. Progress goes to
stderr. Fractions (`*_ceiling_fraction`) are taken per repeat, then their median reported:
W1 call rates (items/s / items per call) over the 64 B echo calls/s (updates over the echo
with the same calls in flight), W2 MB/s over the 1 MiB echo MB/s. As the echo moves its
payload both ways with one call in flight, the one-way shapes are closer matches and are
reported too: `*_upload_fraction` (inserts over the upload stream of the same message size
class) and `*_download_fraction` (samples over the download of about their response size). Every server gets SIGTERM at the end and is awaited, also on Ctrl-C.
"""

import argparse
import asyncio
import itertools
import json
import math
import multiprocessing as mp
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import grpc
import numpy as np
import psutil

from apexrl.common.serving import message_options, write_ready_file
from apexrl.replay.client import ReplayClient, insert_request
from apexrl.v1 import replay_pb2_grpc

MAX_MESSAGE_MB = 512  # the replay server's default; the echo server and every channel use it too
INSERT_WINDOW = 4  # Insert requests a writer keeps unacknowledged on its stream
UPDATE_WINDOW = 4  # UpdatePriorities calls kept in flight
ECHO_SERVICE = "bench.Echo"
MB = 1e6
TARGETS = {  # figure key: minimum (printed next to the figure, never asserted)
    "w1_insert_items_per_s": 75_000,
    "w1_sample_items_per_s": 100_000,
    "w1_sample_stream_items_per_s": 100_000,
    "w1_update_512_per_s": 1_000_000,
    "w1_update_4096_per_s": 1_000_000,
    "w2_insert_ceiling_fraction": 0.6,
    "w2_sample_ceiling_fraction": 0.6,
}


@dataclass(frozen=True)
class Sizes:
    seconds: float  # per measurement, unless --seconds
    w1_capacity: int = 1 << 20
    w1_insert_batch: int = 1000
    w1_sample_batch: int = 512
    w1_update_batches: tuple[int, ...] = (512, 4096)
    w2_capacity: int = 50_000
    w2_frames: int = 2000  # ALE frames in the pool (transitions: frames - 4)
    w2_insert_batch: int = 16  # 16 x 56,464 B = 0.90 MB per message, near the 1 MiB ceiling
    w2_sample_batches: tuple[int, ...] = (32, 512)
    echo_payloads: tuple[int, ...] = (64, 1 << 20)
    download_payloads: tuple[int, ...] = (1 << 20, 32 << 20)  # about sample 32 / 512 responses


FULL = Sizes(seconds=3.0)
QUICK = Sizes(seconds=0.5, w2_capacity=2000, w2_frames=300)


# --- processes ---------------------------------------------------------------------------


@dataclass
class ServerProcess:
    name: str
    process: subprocess.Popen
    address: str
    log_path: Path

    @property
    def rss(self) -> int:
        return psutil.Process(self.process.pid).memory_info().rss


def stop_process(process: subprocess.Popen, timeout: float = 30.0) -> int:
    """SIGTERM, then wait (SIGKILL only if it does not exit in time); returns the exit code."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return process.returncode


@contextmanager
def server_process(name: str, command: list[str], workdir: Path) -> Iterator[ServerProcess]:
    """Runs `command --ready-file F` as a child until the block ends; address from F."""
    ready, log_path = workdir / f"{name}.ready.json", workdir / f"{name}.log"
    ready.unlink(missing_ok=True)  # a server of the same name may have run here before
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [*command, "--ready-file", str(ready)], stdout=log, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name} server did not start:\n{log_path.read_text()}")
            time.sleep(0.05)
        port = json.loads(ready.read_text())["port"]
        yield ServerProcess(name, process, f"127.0.0.1:{port}", log_path)
    finally:
        code = stop_process(process)
        if code != 0:
            print(f"{name} server exited {code}:\n{log_path.read_text()[-2000:]}", file=sys.stderr)


def replay_server(name: str, capacity: int, workdir: Path):
    command = [sys.executable, "-m", "apexrl.cli", "replay", "--host", "127.0.0.1", "--port", "0"]
    command += ["--metrics-port", "0", "--capacity", str(capacity), "--min-size-to-sample", "1"]
    command += ["--max-message-mb", str(MAX_MESSAGE_MB), "--grace-seconds", "2"]
    command += ["--log-level", "WARNING"]
    return server_process(name, command, workdir)


def echo_server(workdir: Path):
    return server_process(
        "echo", [sys.executable, str(Path(__file__).resolve()), "--serve-echo"], workdir
    )


def serve_echo(ready_file: str) -> None:
    """The raw ceiling: grpc.aio, no interceptors, bytes in and out (no (de)serializers)."""

    async def echo(request: bytes, context) -> bytes:
        return request

    async def upload(requests, context):
        async for _ in requests:
            yield b"k"

    payloads: dict[int, bytes] = {}

    async def download(request: bytes, context) -> bytes:
        size = int.from_bytes(request, "little")
        if size not in payloads:
            payloads[size] = os.urandom(size)
        return payloads[size]

    async def main() -> None:
        server = grpc.aio.server(options=message_options(MAX_MESSAGE_MB))
        handler = grpc.method_handlers_generic_handler(
            ECHO_SERVICE,
            {
                "Echo": grpc.unary_unary_rpc_method_handler(echo),
                "Upload": grpc.stream_stream_rpc_method_handler(upload),
                "Download": grpc.unary_unary_rpc_method_handler(download),
            },
        )
        server.add_generic_rpc_handlers([handler])
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        write_ready_file(ready_file, port=port)
        await stop.wait()
        await server.stop(1)

    asyncio.run(main())


def channel(address: str) -> grpc.Channel:
    return grpc.insecure_channel(address, options=message_options(MAX_MESSAGE_MB))


# --- data --------------------------------------------------------------------------------


def cartpole_columns(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    obs = rng.standard_normal((n, 4)).astype(np.float32)
    return {
        "obs": obs,
        "action": rng.integers(0, 2, n).astype(np.int64),
        "reward": np.ones(n, np.float32),
        "discount": np.full(n, 0.99, np.float32),
        "next_obs": obs + np.float32(0.01),
    }


def atari_frames(n: int, seed: int = 0) -> np.ndarray:
    """n consecutive 84x84 grayscale Pong frames (uint8) under a random policy."""
    import ale_py
    import gymnasium

    gymnasium.register_envs(ale_py)
    env = gymnasium.make("ALE/Pong-v5", obs_type="grayscale")
    env.action_space.seed(seed)
    rows = np.linspace(0, 209, 84).round().astype(np.intp)[:, None]
    cols = np.linspace(0, 159, 84).round().astype(np.intp)[None, :]
    frame, _ = env.reset(seed=seed)
    frames = np.empty((n, 84, 84), np.uint8)
    for i in range(n):
        frames[i] = frame[rows, cols]
        frame, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            frame, _ = env.reset()
    env.close()
    return frames


def atari_columns(frames: np.ndarray, seed: int = 0) -> dict[str, np.ndarray]:
    """Transitions t = 0 .. len(frames) - 5: obs = frames t..t+3 stacked last, next_obs t+1..t+4."""
    stacks = np.lib.stride_tricks.sliding_window_view(frames, 4, axis=0)  # [n - 3, 84, 84, 4]
    n = len(stacks) - 1
    rng = np.random.default_rng(seed)
    return {
        "obs": stacks[:-1],
        "action": rng.integers(0, 6, n).astype(np.int64),
        "reward": rng.choice(np.array([-1, 0, 0, 0, 0, 0, 1], np.float32), n),
        "discount": np.full(n, 0.99, np.float32),
        "next_obs": stacks[1:],
    }


def item_bytes(columns: dict[str, np.ndarray]) -> int:
    return sum(a.dtype.itemsize * math.prod(a.shape[1:]) for a in columns.values())


def insert_requests(columns: dict[str, np.ndarray], batch: int, seed: int = 0) -> list:
    """The pool cut into InsertRequests of `batch` items, each with random priorities."""
    rng = np.random.default_rng(seed)
    n = len(next(iter(columns.values())))
    return [
        insert_request(
            "default",
            {k: v[i : i + batch] for k, v in columns.items()},
            rng.uniform(0.1, 2.0, batch).astype(np.float32),
        )
        for i in range(0, n - batch + 1, batch)
    ]


# --- pumps: drive calls for a while, count what came back --------------------------------


def timed_loop(call: Callable[[], object], seconds: float) -> tuple[int, float]:
    """Blocking calls back to back for `seconds`; returns (calls, elapsed)."""
    calls, started = 0, time.monotonic()
    deadline = started + seconds
    while True:
        call()
        calls += 1
        if time.monotonic() >= deadline:
            return calls, time.monotonic() - started


def pump_unary(multicallable, requests: list, seconds: float, window: int) -> tuple[int, float]:
    """Unary calls cycling through `requests`, `window` in flight (.future()); (calls, elapsed)."""
    pending, calls, cycle = deque(), 0, itertools.cycle(requests)
    started = time.monotonic()
    deadline = started + seconds
    while True:
        while len(pending) < window and time.monotonic() < deadline:
            pending.append(multicallable.future(next(cycle), timeout=60))
        if not pending:
            return calls, time.monotonic() - started
        pending.popleft().result()
        calls += 1


def pump_stream(
    stream_stream,
    requests: list,
    window: int,
    seconds: float = math.inf,
    max_messages: int | None = None,
) -> tuple[int, float]:
    """Streams `requests` cyclically on one call, at most `window` unacknowledged.

    Returns (acks counted, elapsed) when `seconds` pass or `max_messages` are acked; acks
    still in flight then are drained, uncounted, so the stream ends cleanly.
    """
    credits, finished = threading.Semaphore(window), threading.Event()

    def send():
        for sent, request in enumerate(itertools.cycle(requests)):
            if max_messages is not None and sent >= max_messages:
                return
            while not credits.acquire(timeout=0.05):
                if finished.is_set():
                    return
            if finished.is_set():
                return
            yield request

    acked, started = 0, time.monotonic()
    responses = stream_stream(send(), timeout=min(seconds, 600) + 120)
    for _ in responses:
        acked += 1
        credits.release()
        if time.monotonic() - started >= seconds:
            break
    elapsed = time.monotonic() - started
    finished.set()
    for _ in responses:
        pass
    return acked, elapsed


# --- writers: each in its own spawned process -------------------------------------------


@dataclass(frozen=True)
class WriterSpec:
    kind: str  # "cartpole" / "atari": Insert stream to a replay server; "upload": echo Upload
    batch: int = 1  # items per Insert message
    payload: int = 0  # bytes per Upload message
    frames: np.ndarray | None = None  # the Atari frame pool


def writer_call(spec: WriterSpec, ch: grpc.Channel) -> tuple[Callable, list]:
    """The stream_stream callable and the request pool a writer cycles through."""
    if spec.kind == "upload":
        return ch.stream_stream(f"/{ECHO_SERVICE}/Upload"), [os.urandom(spec.payload)]
    columns = cartpole_columns(16 * spec.batch) if spec.kind == "cartpole" else None
    if spec.kind == "atari":
        columns = atari_columns(spec.frames)
    return replay_pb2_grpc.ReplayStub(ch).Insert, insert_requests(columns, spec.batch)


def _writer_child(address, spec, seconds, barrier, results) -> None:
    try:
        with channel(address) as ch:
            grpc.channel_ready_future(ch).result(timeout=60)
            call, requests = writer_call(spec, ch)
            barrier.wait(timeout=300)
            started = time.monotonic()
            acked, elapsed = pump_stream(call, requests, INSERT_WINDOW, seconds)
        results.put((acked, started, started + elapsed))
    except BaseException as err:
        results.put(f"writer failed: {err!r}")
        raise


def run_writers(address: str, spec: WriterSpec, writers: int, seconds: float) -> float:
    """Messages/s acked by `writers` spawned processes together (first start to last end)."""
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(writers + 1), ctx.Queue()
    procs = [
        ctx.Process(target=_writer_child, args=(address, spec, seconds, barrier, results))
        for _ in range(writers)
    ]
    try:
        for p in procs:
            p.start()
        barrier.wait(timeout=300)
        outcomes = [results.get(timeout=seconds + 300) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.terminate()
                p.join()
    failures = [o for o in outcomes if isinstance(o, str)]
    if failures:
        raise RuntimeError("; ".join(failures))
    acked = sum(o[0] for o in outcomes)
    return acked / (max(o[2] for o in outcomes) - min(o[1] for o in outcomes))


# --- workloads -----------------------------------------------------------------------------


def size_label(size: int) -> str:
    return f"{size >> 20}mib" if size >= 1 << 20 else f"{size}b"


def measure_ceiling(address: str, sizes: Sizes, seconds: float) -> dict[str, float]:
    figures = {}
    with channel(address) as ch:
        grpc.channel_ready_future(ch).result(timeout=60)
        echo = ch.unary_unary(f"/{ECHO_SERVICE}/Echo")
        for size in sizes.echo_payloads:
            label = size_label(size)
            payload = os.urandom(size)
            calls, elapsed = timed_loop(lambda p=payload: echo(p, timeout=60), seconds)
            figures[f"ceiling_echo_{label}_calls_per_s"] = calls / elapsed
            figures[f"ceiling_echo_{label}_mb_per_s"] = calls * size / elapsed / MB
        calls, elapsed = pump_unary(echo, [os.urandom(64)], seconds, UPDATE_WINDOW)
        figures[f"ceiling_echo_64b_{UPDATE_WINDOW}inflight_calls_per_s"] = calls / elapsed
        download = ch.unary_unary(f"/{ECHO_SERVICE}/Download")
        for size in sizes.download_payloads:
            request = size.to_bytes(8, "little")
            calls, elapsed = timed_loop(lambda r=request: download(r, timeout=60), seconds)
            figures[f"ceiling_download_{size_label(size)}_mb_per_s"] = calls * size / elapsed / MB
    for size in sizes.echo_payloads:
        label = size_label(size)
        rate = run_writers(address, WriterSpec("upload", payload=size), 1, seconds)
        figures[f"ceiling_upload_{label}_msgs_per_s"] = rate
        figures[f"ceiling_upload_{label}_mb_per_s"] = rate * size / MB
    return figures


def measure_w1(address: str, sizes: Sizes, seconds: float) -> dict[str, float]:
    batch = sizes.w1_insert_batch
    figures = {
        "w1_insert_items_per_s": run_writers(address, WriterSpec("cartpole", batch), 1, seconds)
        * batch,
        "w1_insert_4w_items_per_s": run_writers(address, WriterSpec("cartpole", batch), 4, seconds)
        * batch,
    }
    columns, rng = cartpole_columns(batch, seed=1), np.random.default_rng(1)
    with ReplayClient(address, timeout=60) as client:
        calls, elapsed = timed_loop(lambda: client.insert(columns), seconds)
        figures["w1_insert_client_items_per_s"] = calls * batch / elapsed

        b = sizes.w1_sample_batch
        calls, elapsed = timed_loop(lambda: client.sample(b, beta=0.4), seconds)
        figures["w1_sample_items_per_s"] = calls * b / elapsed
        figures["w1_sample_stream_items_per_s"] = sample_stream_rate(client, b, seconds) * b

        for n in sizes.w1_update_batches:
            requests = [
                client.update_request(
                    client.sample(n, beta=0.4).keys, rng.uniform(0.1, 2.0, n).astype(np.float32)
                )
                for _ in range(8)
            ]
            calls, elapsed = pump_unary(
                client.stub.UpdatePriorities, requests, seconds, UPDATE_WINDOW
            )
            figures[f"w1_update_{n}_per_s"] = calls * n / elapsed
    return figures


def sample_stream_rate(client: ReplayClient, batch: int, seconds: float) -> float:
    """Batches/s from sample_stream, timed from the first batch (the stream is open)."""
    stream = client.sample_stream(batch, beta=0.4)
    try:
        next(stream)
        batches, started = 0, time.monotonic()
        for _ in stream:
            batches += 1
            if time.monotonic() - started >= seconds:
                break
        return batches / (time.monotonic() - started)
    finally:
        stream.close()  # cancels the call


def fill_w2(server: ServerProcess, frames: np.ndarray, sizes: Sizes) -> dict[str, float]:
    """Once, before the repeats: fills the empty table, timed (every page is touched first
    here), and records the empty server's RSS for the per-item figure."""
    rss_empty = server.rss
    per_item = item_bytes(atari_columns(frames[:6]))
    with ReplayClient(server.address, timeout=120) as client:
        started = time.monotonic()
        fill(client, frames, sizes.w2_insert_batch, sizes.w2_capacity)
        elapsed = time.monotonic() - started
    return {
        "w2_fill_mb_per_s": sizes.w2_capacity * per_item / elapsed / MB,
        "w2_rss_empty_bytes": rss_empty,
    }


def measure_w2(
    server: ServerProcess, frames: np.ndarray, sizes: Sizes, seconds: float, rss_empty: float
) -> dict[str, float]:
    """On the full table: inserts overwrite the oldest items (the steady state)."""
    per_item = item_bytes(atari_columns(frames[:6]))
    batch = sizes.w2_insert_batch
    rate = run_writers(server.address, WriterSpec("atari", batch, frames=frames), 1, seconds)
    figures = {
        "w2_insert_items_per_s": rate * batch,
        "w2_insert_mb_per_s": rate * batch * per_item / MB,
    }
    with ReplayClient(server.address, timeout=120) as client:
        for b in sizes.w2_sample_batches:
            calls, elapsed = timed_loop(lambda b=b: client.sample(b, beta=0.4), seconds)
            figures[f"w2_sample{b}_items_per_s"] = calls * b / elapsed
            figures[f"w2_sample{b}_mb_per_s"] = calls * b * per_item / elapsed / MB
    figures["w2_rss_bytes_per_item"] = (server.rss - rss_empty) / sizes.w2_capacity
    figures["w2_item_bytes"] = per_item
    return figures


def fill(client: ReplayClient, frames: np.ndarray, batch: int, capacity: int) -> None:
    """Inserts until the table is full."""
    missing = capacity - client.info().size
    if missing > 0:
        requests = insert_requests(atari_columns(frames), batch, seed=2)
        pump_stream(client.stub.Insert, requests, INSERT_WINDOW, max_messages=-(-missing // batch))


def add_fractions(f: dict[str, float], sizes: Sizes) -> None:
    """Each figure over its ceiling, from the same repeat (see the module docstring)."""
    echo64 = f["ceiling_echo_64b_calls_per_s"]
    echo64_window = f[f"ceiling_echo_64b_{UPDATE_WINDOW}inflight_calls_per_s"]
    calls = {
        "w1_insert": (f["w1_insert_items_per_s"] / sizes.w1_insert_batch, echo64),
        "w1_insert_4w": (f["w1_insert_4w_items_per_s"] / sizes.w1_insert_batch, echo64),
        "w1_insert_client": (f["w1_insert_client_items_per_s"] / sizes.w1_insert_batch, echo64),
        "w1_sample": (f["w1_sample_items_per_s"] / sizes.w1_sample_batch, echo64),
        "w1_sample_stream": (f["w1_sample_stream_items_per_s"] / sizes.w1_sample_batch, echo64),
        **{
            f"w1_update_{n}": (f[f"w1_update_{n}_per_s"] / n, echo64_window)
            for n in sizes.w1_update_batches
        },
    }
    for name, (rate, ceiling) in calls.items():
        f[f"{name}_ceiling_fraction"] = rate / ceiling
    f["w1_insert_upload_fraction"] = (
        f["w1_insert_items_per_s"] / sizes.w1_insert_batch / f["ceiling_upload_64b_msgs_per_s"]
    )
    echo_mb, upload_mb = f["ceiling_echo_1mib_mb_per_s"], f["ceiling_upload_1mib_mb_per_s"]
    f["w2_insert_ceiling_fraction"] = f["w2_insert_mb_per_s"] / echo_mb
    f["w2_insert_upload_fraction"] = f["w2_insert_mb_per_s"] / upload_mb
    small, large = sizes.w2_sample_batches
    f[f"w2_sample{small}_ceiling_fraction"] = f[f"w2_sample{small}_mb_per_s"] / echo_mb
    f["w2_sample_ceiling_fraction"] = f[f"w2_sample{large}_mb_per_s"] / echo_mb
    small_dl, large_dl = (
        f"ceiling_download_{size_label(s)}_mb_per_s" for s in sizes.download_payloads
    )
    f[f"w2_sample{small}_download_fraction"] = f[f"w2_sample{small}_mb_per_s"] / f[small_dl]
    f[f"w2_sample{large}_download_fraction"] = f[f"w2_sample{large}_mb_per_s"] / f[large_dl]


# --- driver --------------------------------------------------------------------------------


def summarize(runs: dict[str, list[float]], keys: list[str]) -> dict:
    medians = {k: round(statistics.median(runs[k]), 4) for k in keys}
    return {**medians, "runs": {k: [round(v, 4) for v in runs[k]] for k in keys}}


def workload_of(key: str) -> str:
    return key.split("_", 1)[0]


def run(args: argparse.Namespace) -> dict:
    sizes = QUICK if args.quick else FULL
    seconds = args.seconds or sizes.seconds
    log(f"collecting {sizes.w2_frames} ALE Pong frames")
    frames = atari_frames(sizes.w2_frames)
    runs: dict[str, list[float]] = defaultdict(list)
    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="replay-bench-") as tmp, ExitStack() as stack:
        workdir = Path(tmp)
        echo = stack.enter_context(echo_server(workdir))
        w1 = stack.enter_context(replay_server("w1", sizes.w1_capacity, workdir))
        w2 = stack.enter_context(replay_server("w2", sizes.w2_capacity, workdir))
        log(f"filling the W2 table ({sizes.w2_capacity} items)")
        for k, v in fill_w2(w2, frames, sizes).items():
            runs[k].append(v)
        rss_empty = runs["w2_rss_empty_bytes"][0]
        for repeat in range(args.repeats):
            figures = {}
            for name, measure in (
                ("ceiling", lambda: measure_ceiling(echo.address, sizes, seconds)),
                ("w1", lambda: measure_w1(w1.address, sizes, seconds)),
                ("w2", lambda: measure_w2(w2, frames, sizes, seconds, rss_empty)),
            ):
                log(f"repeat {repeat + 1}/{args.repeats}: {name}")
                figures.update(measure())
            add_fractions(figures, sizes)
            for k, v in figures.items():
                runs[k].append(v)
            load.append(os.getloadavg()[0])
            log("  " + ", ".join(f"{k}={v:.4g}" for k, v in figures.items()))
    for workload in ("ceiling", "w1", "w2"):
        keys = [k for k in runs if workload_of(k) == workload]
        print(json.dumps({"workload": workload, **summarize(runs, keys)}), flush=True)
    summary = summarize(runs, list(runs))
    summary["targets"] = {
        k: {"min": t, "figure": summary[k], "met": summary[k] >= t} for k, t in TARGETS.items()
    }
    summary["settings"] = {
        **asdict(sizes),
        "seconds": seconds,
        "repeats": args.repeats,
        "insert_window": INSERT_WINDOW,
        "update_window": UPDATE_WINDOW,
        "max_message_mb": MAX_MESSAGE_MB,
    }
    summary["environment"] = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "python": platform.python_version(),
        "grpc": grpc.__version__,
        "cpus": os.cpu_count(),
        "load_1min": [round(x, 2) for x in load],
    }
    return summary


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="report medians of this many")
    parser.add_argument("--quick", action="store_true", help="small sizes, short measurements")
    parser.add_argument("--seconds", type=float, default=0.0, help="per measurement (0: default)")
    parser.add_argument("--serve-echo", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--ready-file", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick and "--repeats" not in (argv or sys.argv):
        args.repeats = 1
    return args


def main() -> None:
    args = parse_args()
    if args.serve_echo:
        serve_echo(args.ready_file)
        return
    print(json.dumps(run(args)), flush=True)


if __name__ == "__main__":
    main()
