"""The DeepMind Reverb half of atari_vs_reverb.py. Runs under a Python that has dm-reverb
0.14 (a separate venv, never apexrl's), which atari_vs_reverb.py calls:

    /tmp/reverb-venv/bin/python benchmarks/reverb_side.py --items 20000 --nstep 1 --repeats 3

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


def one_run(fields: dict, items: int, method: str, folder: Path) -> dict:
    import reverb

    ready = folder / f"ready-{time.monotonic_ns()}.json"
    process = subprocess.Popen(
        [sys.executable, __file__, "serve", "--items", str(items), "--ready", str(ready)]
    )
    try:
        while not ready.exists() or not ready.read_text():
            if process.poll() is not None:
                raise RuntimeError("reverb server did not start")
            time.sleep(0.05)
        client = reverb.Client(f"localhost:{json.loads(ready.read_text())['port']}")
        client.server_info()
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
    finally:
        process.terminate()
        process.wait(60)
    if size != items:
        raise RuntimeError(f"reverb holds {size} items, expected {items}")
    return {
        "items": size,
        "rss_bytes_per_item": round((after - before) / size, 1),
        "rss_before_mb": round(before / 2**20, 1),
        "insert_items_per_s": round(items / seconds),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("mode", nargs="?", default="measure", choices=("measure", "serve"))
    parser.add_argument("--items", type=int, default=20_000)
    parser.add_argument("--nstep", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--method", choices=("writer", "insert"), default="writer")
    parser.add_argument("--ready", type=Path)
    args = parser.parse_args()
    if args.mode == "serve":
        serve(args.items, args.ready)
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
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
