"""The DeepMind Reverb half of atari_vs_reverb.py. Runs under a Python that has dm-reverb
0.14 (a separate venv, never apexrl's), which atari_vs_reverb.py calls:

    ~/reverb-venv/bin/python benchmarks/reverb_side.py --items 20000 --nstep 1 --repeats 3

Per repeat: a fresh Reverb server in its own process (`serve` below: one reverb.Table,
Prioritized(0.6) sampler, Fifo remover, max_size = items, MinSize(1) rate limiter), then this
process inserts `items` synthetic transitions (synthetic_frames.py, the same seed and code as
apexrl's side) with Reverb's Python client and reads the server's VmRSS growth per item.

How Reverb stores them: `client.insert(data, priorities)` opens a legacy `Writer` with
max_sequence_length=1, hence chunk_length=1: each item becomes one ChunkData holding one
timestep, and the client compresses every flattened tensor of it (obs, action, reward,
discount, next_obs) separately with snappy (CompressTensorAsProto; delta encoding is off by
default) before streaming it. The server keeps that chunk as received (compressed) for as long
as an item references it. So obs and next_obs are two independent snappy blocks: the 3 frames
they share (n=1) are stored twice, and each stack again in the neighbouring items. `--method
writer` (the default) keeps one such Writer open for all items (append + create_item, chunk
length 1): the same chunks and bytes as calling client.insert per item, without opening a
gRPC stream per item; `--method insert` calls client.insert per item.

stdout: one JSON object per repeat, then one with all of them (the last line).

`--priorities SECONDS`: Reverb's priority path instead, the counterpart of insert_paths.py's
update_priorities_512 (which runs this through `insert_paths.py --reverb PYTHON`):

    ~/reverb-venv/bin/python benchmarks/reverb_side.py --priorities 3 --repeats 3

Per repeat: a fresh server (`serve`, max_size 1,000,000), filled with 200,000 CartPole-size items
(obs f32[4], action i64, reward f32, discount f32, next_obs f32[4]; zeros, as insert_paths.py
inserts) through one legacy `Writer` with chunk_length = max_sequence_length = 256: append +
create_item(num_timesteps=1, priority=1.0) per item, flush at the end; the fastest of Reverb's
Python insert paths tried (a 2-CPU machine, server in the same process: ~40K items/s;
chunk_length 64: ~30K; chunk_length 1: ~13K; TrajectoryWriter: ~5K; client.insert: ~1.3K, a
stream per item; ~20K against the `serve` process, as here: fill_items_per_s). Item keys are random uint64s
the C++ writer draws and never hands to Python, so the keys are read back by sampling: 200,000
samples (the pybind Sampler that Client.sample iterates over, with 256 samples in flight rather
than its 1: ~29K samples/s against ~8K; only the info tensors read), whose distinct keys (~63 %,
~126K, all priority 1.0 so sampled uniformly) form the pool. Then for SECONDS, one call at a
time: `client.mutate_priorities(TABLE, updates={key: priority, ...})`, 512 distinct pool keys
per call (256 such dicts built beforehand, used in turn, as insert_paths.py builds its 256
updates), priorities uniform in [0, 2). mutate_priorities_512 = calls/s x 512. Afterwards 2,000
samples check that every sampled item holds the priority last written to it (1.0 if none was).
rss_before_mb, rss_filled_mb: the server's VmRSS empty and once filled.
"""

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import synthetic_frames  # noqa: E402

TABLE = "priority_table"


def serve(items: int, ready: Path) -> None:
    import reverb

    table = reverb.Table(
        name=TABLE,
        sampler=reverb.selectors.Prioritized(0.6),
        remover=reverb.selectors.Fifo(),
        max_size=items,
        rate_limiter=reverb.rate_limiters.MinSize(1),
    )
    checkpointer = reverb.checkpointers.DefaultCheckpointer(str(ready.parent / "checkpoints"))
    server = reverb.Server(tables=[table], port=None, checkpointer=checkpointer)
    ready.write_text(json.dumps({"port": server.port}))
    server.wait()


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def digest(fields: dict) -> str:
    """sha256 of obs and next_obs: both sides print it, atari_vs_reverb.py compares."""
    h = hashlib.sha256()
    for name in ("obs", "next_obs", "action", "reward", "discount"):
        h.update(fields[name].tobytes())
    return h.hexdigest()


@contextmanager
def reverb_server(max_size: int, folder: Path):
    """A `serve` process holding a table of max_size, and a Client connected to it."""
    import reverb

    ready = folder / f"ready-{time.monotonic_ns()}.json"
    process = subprocess.Popen(
        [sys.executable, __file__, "serve", "--items", str(max_size), "--ready", str(ready)]
    )
    try:
        while not ready.exists() or not ready.read_text():
            if process.poll() is not None:
                raise RuntimeError("reverb server did not start")
            time.sleep(0.05)
        client = reverb.Client(f"localhost:{json.loads(ready.read_text())['port']}")
        client.server_info()
        yield process, client
    finally:
        process.terminate()
        process.wait(60)


def one_run(fields: dict, items: int, method: str, folder: Path) -> dict:
    with reverb_server(items, folder) as (process, client):
        before = rss(process.pid)
        begin = time.perf_counter()
        rows = ({name: fields[name][i] for name in fields} for i in range(items))
        if method == "insert":
            for row in rows:
                client.insert(row, priorities={TABLE: 1.0})
        else:
            with client.writer(max_sequence_length=1) as writer:
                for row in rows:
                    writer.append(row)
                    writer.create_item(TABLE, num_timesteps=1, priority=1.0)
        seconds = time.perf_counter() - begin
        size = client.server_info()[TABLE].current_size
        time.sleep(0.2)
        after = rss(process.pid)
    if size != items:
        raise RuntimeError(f"reverb holds {size} items, expected {items}")
    return {
        "items": size,
        "rss_bytes_per_item": round((after - before) / size, 1),
        "rss_before_mb": round(before / 2**20, 1),
        "insert_items_per_s": round(items / seconds),
    }


# --- --priorities: Client.mutate_priorities -----------------------------------------------

PRIORITY_CAPACITY = 1_000_000
PRIORITY_ITEMS = 200_000
PER_CALL = 512
CHUNK = 256
UPDATES = 256
CHECK_SAMPLES = 2_000


def cartpole_row():
    import numpy as np

    return {"obs": np.zeros(4, np.float32), "action": np.int64(0),
            "reward": np.float32(0), "discount": np.float32(1),
            "next_obs": np.zeros(4, np.float32)}  # fmt: skip


def sampled(client, count: int):
    """(key, priority) of `count` samples through the pybind Sampler that Client.sample iterates
    over (256 in flight, not its 1), reading only the info tensors: key, probability,
    table_size, priority, times_sampled."""
    sampler = client._client.NewSampler(TABLE, count, 256)
    for _ in range(count):
        sample = sampler.GetNextTrajectory()
        yield int(sample[0]), float(sample[3])


def fill(client, items: int) -> float:
    """items/s of the fill; returns once the server holds all of them."""
    row = cartpole_row()
    begin = time.perf_counter()
    with client.writer(max_sequence_length=CHUNK, chunk_length=CHUNK) as writer:
        for _ in range(items):
            writer.append(row)
            writer.create_item(TABLE, num_timesteps=1, priority=1.0)
        writer.flush()
    seconds = time.perf_counter() - begin
    deadline = time.monotonic() + 60
    while (size := client.server_info()[TABLE].current_size) != items:
        if time.monotonic() > deadline:
            raise RuntimeError(f"reverb holds {size} items, expected {items}")
        time.sleep(0.05)
    return items / seconds


def priority_run(seconds: float, items: int, seed: int, folder: Path) -> dict:
    import numpy as np

    rng = np.random.default_rng(seed)
    with reverb_server(PRIORITY_CAPACITY, folder) as (process, client):
        rss_before = rss(process.pid)
        fill_rate = fill(client, items)
        rss_filled = rss(process.pid)
        begin = time.perf_counter()
        pool = np.fromiter({key for key, _ in sampled(client, items)}, np.uint64)
        key_seconds = time.perf_counter() - begin
        updates = []
        for _ in range(UPDATES):
            keys = rng.choice(pool, PER_CALL, replace=False).tolist()
            updates.append(dict(zip(keys, (rng.random(PER_CALL) * 2).tolist(), strict=True)))
        mutate = client.mutate_priorities
        calls, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            mutate(TABLE, updates=updates[calls % UPDATES])
            calls += 1
        elapsed = time.perf_counter() - started
        # The last min(calls, UPDATES) calls hold every dict used, so they give each key's
        # last written priority.
        expected: dict[int, float] = {}
        for i in range(calls - min(calls, UPDATES), calls):
            expected.update(updates[i % UPDATES])
        wrong = sum(
            abs(priority - expected.get(key, 1.0)) > 1e-9
            for key, priority in sampled(client, CHECK_SAMPLES)
        )
    if wrong:
        raise RuntimeError(f"{wrong} of {CHECK_SAMPLES} sampled items hold another priority")
    return {
        "items": items,
        "fill_items_per_s": round(fill_rate),
        "rss_before_mb": round(rss_before / 2**20, 1),
        "rss_filled_mb": round(rss_filled / 2**20, 1),
        "key_pool": len(pool),
        "key_sampling_s": round(key_seconds, 1),
        "calls": calls,
        "mutate_priorities_512": round(calls * PER_CALL / elapsed),
    }


def priorities(seconds: float, repeats: int, items: int, seed: int) -> None:
    folder = Path(tempfile.mkdtemp(prefix="reverb-side-"))
    runs = []
    try:
        for repeat in range(repeats):
            run = priority_run(seconds, items, seed + repeat, folder)
            print(json.dumps({"reverb_priorities_run": run}), flush=True)
            runs.append(run)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    from importlib.metadata import version

    print(json.dumps({
        "reverb_version": version("dm-reverb"),
        "method": "mutate_priorities",
        "fill": f"legacy Writer, chunk_length {CHUNK}",
        "per_call": PER_CALL,
        "seconds": seconds,
        "runs": runs,
        "mutate_priorities_512_median": statistics.median(
            r["mutate_priorities_512"] for r in runs
        ),
    }), flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("mode", nargs="?", default="measure", choices=("measure", "serve"))
    parser.add_argument("--items", type=int, help="default: 20,000; --priorities: 200,000")
    parser.add_argument("--nstep", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--method", choices=("writer", "insert"), default="writer")
    parser.add_argument("--ready", type=Path)
    parser.add_argument("--priorities", type=float, metavar="SECONDS",
                        help="measure Client.mutate_priorities for SECONDS a repeat instead")  # fmt: skip
    args = parser.parse_args()
    if args.mode == "serve":
        serve(args.items, args.ready)
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if args.priorities is not None:
        priorities(args.priorities, args.repeats, args.items or PRIORITY_ITEMS, args.seed)
        return
    args.items = args.items or 20_000
    fields = synthetic_frames.transitions(args.items, args.nstep, args.seed)
    folder = Path(tempfile.mkdtemp(prefix="reverb-side-"))
    runs = []
    for _ in range(args.repeats):
        run = one_run(fields, args.items, args.method, folder)
        print(json.dumps({"reverb_run": run, "nstep": args.nstep}), flush=True)
        runs.append(run)
    shutil.rmtree(folder, ignore_errors=True)
    from importlib.metadata import version

    print(json.dumps({
        "reverb_version": version("dm-reverb"),
        "method": args.method,
        "nstep": args.nstep,
        "items": args.items,
        "digest": digest(fields),
        "runs": runs,
        "rss_bytes_per_item_median": statistics.median(r["rss_bytes_per_item"] for r in runs),
        "insert_items_per_s_median": statistics.median(r["insert_items_per_s"] for r in runs),
    }), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
