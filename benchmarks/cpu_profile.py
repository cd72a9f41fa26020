"""Where each CPU-second of a local run goes: per process, and per stage inside each process.

    .venv/bin/python benchmarks/cpu_profile.py                         # dqn on Pong, 60 s + 120 s
    .venv/bin/python benchmarks/cpu_profile.py --algorithm ppo --env ALE/Pong-v5
    .venv/bin/python benchmarks/cpu_profile.py --variant before=DIR --variant after=DIR2

Starts `apexrl local` (target 1e9: it never stops by solving, seed 1), lets it warm up for
`--warmup` seconds, then for `--seconds` records:
- each service process's CPU (user + system, psutil) and its share of what the services used;
- py-spy's samples of every thread that was on a CPU (`py-spy record --format raw`, idle
  threads left out), sorted into stages by the innermost frame a rule names (STAGES below):
  an actor's env step and preprocessing, its inference, compression and gRPC; the learner's
  sampling, decode, SGD step, priority write-back and publishing; the evaluator's games.
  Native code (torch, ALE, zstd) counts against the Python frame that called it;
- the learner's updates and the actors' agent steps over the window, from their /metrics.

A variant runs the `apexrl` package found in DIR (a folder holding `apexrl/`, as
benchmarks/startup.py's) through PYTHONPATH; variants take turns, once each per --repeats.
Prints one JSON line per run. Needs py-spy (`pip install py-spy`), run as a user that may
ptrace the children (root, or kernel.yama.ptrace_scope 0).
"""

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path

import psutil

# (stage, pattern): a sample's stage is that of the innermost frame (py-spy's "function
# (file:line)") any pattern matches; samples no pattern matches count as "other".
STAGES: dict[str, list[tuple[str, str]]] = {
    "actor": [
        ("compress", r"zstandard|columns\.py|codec\.py"),
        ("grpc", r"grpc|outlets\.py|replay/client\.py|learner_client\.py"),
        ("inference", r"torch|numpy_policies\.py|networks\.py|\(act |policy"),
        ("env step", r"gymnasium|ale_py|cv2|envs\.py|envpool"),
        ("adder", r"adders/"),
        ("parameters", r"actor/parameters\.py"),
    ],
    "learner": [
        ("decode", r"zstandard|codec\.py|columns\.py|to_device|tensors\.py"),
        ("write-back", r"write_back\.py"),
        ("sampling", r"grpc|replay/client\.py|datasets\.py"),
        ("publish", r"parameters\.py|state_to_numpy|servicer\.py"),
        ("sgd step", r"torch|learning\.py|losses\.py|networks\.py"),
    ],
    "evaluator": [
        ("env step", r"gymnasium|ale_py|cv2|envs\.py"),
        ("inference", r"torch|numpy_policies\.py|networks\.py"),
        ("grpc", r"grpc|learner_client\.py"),
    ],
    "replay": [
        ("sampling", r"[Ss]ample|sum_tree"),
        ("insert", r"[Ii]nsert"),
        ("priority updates", r"[Mm]utate|[Pp]riorit"),
    ],
}
# After a process's own rules: serving /metrics to local mode's monitor, and gRPC's own threads
# and event loop.
COMMON = [
    ("metrics", r"prometheus_client|wsgiref|socketserver"),
    ("grpc", r"grpc|asyncio|selectors\.py"),
]


def role(name: str) -> str:
    """A process's kind from its ready file's name (actor-0, learner, replay-0, ...)."""
    return name.split("-")[0]


def stage_of(stack: str, rules: list[tuple[str, str]]) -> str:
    for frame in reversed(stack.split(";")):
        for stage, pattern in rules:
            if re.search(pattern, frame):
                return stage
    return "other"


def stages(raw: Path, kind: str) -> dict[str, float]:
    """Shares of a process's on-CPU samples per stage, from py-spy's raw (collapsed) output."""
    counts: Counter[str] = Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack:
            counts[stage_of(stack, STAGES.get(kind, []) + COMMON)] += int(count)
    total = sum(counts.values()) or 1
    return {stage: round(n / total, 3) for stage, n in counts.most_common()}


def scrape(ready: Path, metric: str) -> float:
    port = json.loads(ready.read_text())["metrics_port"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    found = re.search(rf"^{metric}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def counters(run_dir: Path) -> dict[str, float]:
    ready = run_dir / "ready"
    steps = sum(scrape(p, "apexrl_actor_env_steps_total") for p in ready.glob("actor-*.json"))
    return {
        "updates": scrape(ready / "learner.json", "apexrl_learner_updates_total"),
        "agent_steps": steps,
    }


def services(local: subprocess.Popen) -> dict[str, psutil.Process]:
    found = {}
    for child in psutil.Process(local.pid).children():
        try:
            cmdline = child.cmdline()
            found[Path(cmdline[cmdline.index("--ready-file") + 1]).stem] = child
        except (psutil.Error, ValueError, IndexError):
            continue
    return found


def cpu(processes: dict[str, psutil.Process]) -> dict[str, float]:
    return {name: sum(p.cpu_times()[:2]) for name, p in processes.items()}


def one_run(args, pythonpath: str) -> dict:
    run_dir = Path(tempfile.mkdtemp(prefix="cpu-profile-"))
    command = [sys.executable, "-m", "apexrl.cli", "local", "--algorithm", args.algorithm,
               "--env", args.env, "--seed", "1", "--run-dir", str(run_dir),
               "--target-return", "1e9",
               "--max-seconds", str(args.warmup + args.seconds + 60),
               *(["--config", args.config] if args.config else [])]  # fmt: skip
    environ = {**os.environ, "PYTHONPATH": pythonpath} if pythonpath else None
    local = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=environ
    )
    try:
        time.sleep(args.warmup)
        processes = services(local)
        spies = {
            name: subprocess.Popen(
                [
                    args.py_spy,
                    "record",
                    "--pid",
                    str(p.pid),
                    "--duration",
                    str(round(args.seconds)),
                    "--rate",
                    "50",
                    "--format",
                    "raw",
                    "--nonblocking",
                    "--output",
                    str(run_dir / f"{name}.raw"),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )  # fmt: skip
            for name, p in processes.items()
        }
        before, counted, started = cpu(processes), counters(run_dir), time.monotonic()
        time.sleep(args.seconds)
        after, ended, elapsed = cpu(processes), counters(run_dir), time.monotonic() - started
        for spy in spies.values():
            spy.wait(60)
        used = {name: (after[name] - before[name]) / elapsed for name in processes}
        total = sum(used.values())
        result = {
            "algorithm": args.algorithm,
            "env": args.env,
            "seconds": round(elapsed, 1),
            "cores_used": round(total, 3),
            "cores": {name: round(v, 3) for name, v in sorted(used.items())},
            "share": {name: round(v / total, 3) for name, v in sorted(used.items())},
            "updates_per_s": round((ended["updates"] - counted["updates"]) / elapsed, 2),
            "agent_steps_per_s": round((ended["agent_steps"] - counted["agent_steps"]) / elapsed),
            "stages": {
                name: stages(run_dir / f"{name}.raw", role(name))
                for name in sorted(processes)
                if (run_dir / f"{name}.raw").exists()
            },
            "load_1min": round(os.getloadavg()[0], 2),
        }
    finally:
        local.send_signal(signal.SIGINT)
        local.wait(120)
        if args.raw_dir:
            Path(args.raw_dir).mkdir(parents=True, exist_ok=True)
            for raw in run_dir.glob("*.raw"):
                shutil.copy(raw, Path(args.raw_dir) / raw.name)
        shutil.rmtree(run_dir, ignore_errors=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--algorithm", default="dqn")
    parser.add_argument("--env", default="ALE/Pong-v5")
    parser.add_argument("--warmup", type=float, default=60.0, help="seconds before recording")
    parser.add_argument("--seconds", type=float, default=120.0, help="seconds recorded")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--variant", action="append", default=[], help="NAME=DIR")
    parser.add_argument("--raw-dir", default="", help="keep py-spy's raw stacks in this folder")
    parser.add_argument("--config", default="", help="a TOML file of settings over the presets")
    beside = Path(sys.executable).with_name("py-spy")
    parser.add_argument("--py-spy", default=str(beside) if beside.exists() else "py-spy")
    args = parser.parse_args()
    variants = [v.split("=", 1) for v in args.variant] or [["installed", ""]]
    for _ in range(args.repeats):
        for name, folder in variants:
            print(json.dumps({"variant": name, **one_run(args, folder)}), flush=True)


if __name__ == "__main__":
    main()
