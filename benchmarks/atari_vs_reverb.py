"""Replay memory per stored Atari-size item: apexrl against DeepMind Reverb 0.14, side by side.

    python3 -m venv ~/reverb-venv                      # any folder outside the repository
    ~/reverb-venv/bin/pip install "dm-reverb==0.14.0" "tensorflow-cpu~=2.15.0" numpy psutil
    .venv/bin/python benchmarks/atari_vs_reverb.py --reverb-python ~/reverb-venv/bin/python
    .venv/bin/python benchmarks/atari_vs_reverb.py --reverb-python ~/reverb-venv/bin/python \
        --items 2000 --repeats 1 --nsteps 1                 # smoke; the full run: ~2 minutes

The comparison: the same synthetic game-like items (synthetic_frames.py: obs and
next_obs uint8 [4, 84, 84] from one continuing trajectory, next_obs 1 frame later (n=1) and,
also, 3 frames later (n=3), plus action / reward / discount), `items` (20,000) of them inserted
into each system, capacity = items (nothing evicted), `repeats` (3) fresh servers each, median.
Reverb never enters apexrl's venv: its side runs as a subprocess, reverb_side.py under
`--reverb-python` (that venv's Python), which regenerates the same items from the same
seed and code; the two sides' sha256 of the items are compared before any figure is printed.

apexrl: the actor's `pack` (obs and next_obs as one zstd frame per transition), a real
`apexrl replay` process with the compressed Pong signature (benchmarks/atari.py's start_replay),
ReplayClient.insert with 64 items per call. Figure: the replay's VmRSS growth from the empty
table to `items` items, per item, + 8 B for the keys array the table writes whole at start
(the same accounting as atari.py). Info.stored_bytes / size and the mean zstd frame beside it.

Reverb (reverb_side.py's docstring has the details): one reverb.Table (Prioritized(0.6),
Fifo remover, max_size = items, MinSize(1)) in its own server process; the Python client's
legacy Writer with chunk_length 1, which is what client.insert uses: every item is one chunk
whose tensors the client compresses one by one with snappy. Figure: the server's VmRSS growth
per item.

The last stdout line is one JSON object: medians, the ratio apexrl / Reverb (target on n=1:
<= 1/3), settings. Earlier lines: every repeat of each system.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import atari  # noqa: E402
import synthetic_frames  # noqa: E402

GAME = "ALE/Pong-v5"  # only for the signature: obs uint8 [4, 84, 84], Discrete actions
BATCH = 64


def digest(fields: dict) -> str:
    import hashlib

    h = hashlib.sha256()
    for name in ("obs", "next_obs", "action", "reward", "discount"):
        h.update(fields[name].tobytes())
    return h.hexdigest()


def packed_batches(fields: dict) -> tuple[list[dict], float]:
    """The items as the actor sends them: `pack`ed, 64 per insert; and pack's items/s."""
    from apexrl import algorithms
    from apexrl.algorithms.columns import pack
    from apexrl.config import AgentConfig

    columns = algorithms.transition_columns(AgentConfig(env=GAME))
    count = len(fields["action"])
    begin = time.perf_counter()
    batches = [
        pack({k: v[i : i + BATCH] for k, v in fields.items()}, columns)
        for i in range(0, count, BATCH)
    ]
    return batches, count / (time.perf_counter() - begin)


def apexrl_run(batches: list[dict], items: int, folder: Path) -> dict:
    from apexrl.replay.client import ReplayClient

    process, address = atari.start_replay(GAME, items, folder)
    try:
        with ReplayClient(address) as client:
            client.info()
            before = atari.rss(process.pid)
            begin = time.perf_counter()
            for batch in batches:
                client.insert(batch)
            seconds = time.perf_counter() - begin
            info = client.info()
            time.sleep(0.2)
            after = atari.rss(process.pid)
    finally:
        process.terminate()
        process.wait(30)
    if info.size != items:
        raise RuntimeError(f"apexrl holds {info.size} items, expected {items}")
    return {
        "items": info.size,
        "rss_bytes_per_item": round((after - before) / info.size + 8, 1),
        "table_bytes_per_item": round(info.stored_bytes / info.size, 1),
        "rss_before_mb": round(before / 2**20, 1),
        "insert_items_per_s": round(items / seconds),
    }


def reverb_side(python: str, items: int, nstep: int, seed: int, repeats: int) -> dict:
    script = Path(__file__).resolve().parent / "reverb_side.py"
    command = [python, str(script), "--items", str(items), "--nstep", str(nstep),
               "--seed", str(seed), "--repeats", str(repeats)]  # fmt: skip
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    env.pop("PYTHONPATH", None)
    done = subprocess.run(command, stdout=subprocess.PIPE, text=True, env=env, check=True)
    lines = done.stdout.strip().splitlines()
    for line in lines[:-1]:
        print(line, flush=True)
    return json.loads(lines[-1])


def compare(nstep: int, args, folder: Path) -> dict:
    print(f"n={nstep}: generating {args.items} items", file=sys.stderr, flush=True)
    fields = synthetic_frames.transitions(args.items, nstep, args.seed)
    batches, pack_rate = packed_batches(fields)
    sizes = np.concatenate([b["observations"].sizes for b in batches])
    runs = []
    for _ in range(args.repeats):
        run = apexrl_run(batches, args.items, folder)
        print(json.dumps({"apexrl_run": run, "nstep": nstep}), flush=True)
        runs.append(run)
    print(f"n={nstep}: reverb side", file=sys.stderr, flush=True)
    reverb = reverb_side(args.reverb_python, args.items, nstep, args.seed, args.repeats)
    if reverb["digest"] != digest(fields):
        raise RuntimeError("the Reverb side generated different items")
    apexrl_bytes = statistics.median(r["rss_bytes_per_item"] for r in runs)
    reverb_bytes = reverb["rss_bytes_per_item_median"]
    return {
        "nstep": nstep,
        "apexrl_rss_bytes_per_item": apexrl_bytes,
        "apexrl_rss_bytes_per_item_runs": [r["rss_bytes_per_item"] for r in runs],
        "apexrl_table_bytes_per_item": statistics.median(r["table_bytes_per_item"] for r in runs),
        "apexrl_frame_bytes_mean": round(float(sizes.mean()), 1),
        "apexrl_insert_items_per_s": statistics.median(r["insert_items_per_s"] for r in runs),
        "apexrl_pack_items_per_s": round(pack_rate),
        "reverb_rss_bytes_per_item": reverb_bytes,
        "reverb_rss_bytes_per_item_runs": [r["rss_bytes_per_item"] for r in reverb["runs"]],
        "reverb_insert_items_per_s": reverb["insert_items_per_s_median"],
        "apexrl_over_reverb": round(apexrl_bytes / reverb_bytes, 4),
        "raw_pair_bytes": atari.RAW_PAIR_BYTES,
        "items_sha256": reverb["digest"][:16],
        "reverb_version": reverb["reverb_version"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--items", type=int, default=20_000, help="inserted = capacity")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--nsteps", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--reverb-python", default=str(Path.home() / "reverb-venv" / "bin" / "python")
    )
    args = parser.parse_args()
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    if not Path(args.reverb_python).exists():
        sys.exit(f"{args.reverb_python} not found: install dm-reverb 0.14 there (see docstring)")
    folder = Path(tempfile.mkdtemp(prefix="apexrl-vs-reverb-"))
    results = {}
    for nstep in args.nsteps:
        result = compare(nstep, args, folder)
        print(json.dumps(result), flush=True)
        results[nstep] = result
    shutil.rmtree(folder, ignore_errors=True)
    figures = {}
    for nstep, r in results.items():
        suffix = "" if nstep == 1 else f"_n{nstep}"
        for key in ("apexrl_rss_bytes_per_item", "apexrl_table_bytes_per_item",
                    "apexrl_frame_bytes_mean", "reverb_rss_bytes_per_item",
                    "apexrl_over_reverb"):  # fmt: skip
            figures[key + suffix] = r[key]
    if 1 in results:
        figures["target_one_third_of_reverb_met"] = results[1]["apexrl_over_reverb"] <= 1 / 3
    figures.update(items=args.items, repeats=args.repeats, seed=args.seed, statistic="median",
                   reverb_version=next(iter(results.values()))["reverb_version"])  # fmt: skip
    print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
