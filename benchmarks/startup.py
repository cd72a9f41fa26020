"""Local mode's start-up: from the command to the first env step, and where the time goes.

    .venv/bin/python benchmarks/startup.py                        # dqn and ppo on CartPole, 3 runs each
    .venv/bin/python benchmarks/startup.py --runs dqn:ALE/Pong-v5 --repeats 1
    .venv/bin/python benchmarks/startup.py --imports              # python -X importtime per service
    .venv/bin/python benchmarks/startup.py --variant before=DIR --variant after=DIR2

A variant runs the `apexrl` package found in DIR (a folder holding `apexrl/`, e.g. `git archive
COMMIT services` unpacked and renamed) through PYTHONPATH, so two commits compare in one run,
taking turns; without --variant, the installed package runs.

Each run starts `apexrl local` (target 1e9: it never stops by solving) as a subprocess at time
0 and watches it: every child's process start (psutil) and ready file (its mtime: imports done,
servers up), and the first env step, the earliest actor's
apexrl_actor_first_step_timestamp_seconds scraped from its /metrics, and the CPU seconds each
process had used by then (user + system, polled every 20 ms: a figure the machine's load does
not inflate, unlike the wall times). Once an actor has stepped, the run is stopped with SIGINT and its folder removed. Prints one JSON line per run
(seconds from the command's start), then the median per algorithm and env.

--imports prints, per service entry point, the wall time of `python -c 'import apexrl.cli;
import <the service module>'` and the slowest imports in it by cumulative time (from
`-X importtime`), one process at a time (no contention); then, in fresh processes, the CPU
seconds of importing torch, of importing torch._dynamo after it, and of the learner's build
(dqn on CartPole: networks, optimizer, the first version), and whether that build imported
torch._dynamo (torch.optim.Optimizer's constructor does, through torch._disable_dynamo).
"""

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

SERVICES = {
    "local": "apexrl.local.run",
    "replay": "apexrl.replay.server",
    "learner": "apexrl.learner.server",
    "actor": "apexrl.actor.loop",
    "evaluator": "apexrl.evaluator.loop",
}


def first_step(ready: Path) -> float:
    """An actor's first env step (unix time; 0 before it)."""
    port = json.loads(ready.read_text())["metrics_port"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
        text = response.read().decode()
    found = re.search(r"^apexrl_actor_first_step_timestamp_seconds (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def one_run(algorithm: str, env: str, timeout: float, pythonpath: str) -> dict:
    run_dir = Path(tempfile.mkdtemp(prefix="startup-"))
    command = [sys.executable, "-m", "apexrl.cli", "local", "--algorithm", algorithm, "--env", env,
               "--run-dir", str(run_dir), "--target-return", "1e9", "--max-seconds", str(timeout)]  # fmt: skip
    environ = {**os.environ, "PYTHONPATH": pythonpath} if pythonpath else None
    started = time.time()
    local = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=environ
    )
    children: dict[str, float] = {}
    cpu: dict[str, float] = {}  # CPU seconds each process had used by the first env step
    stepped = 0.0
    try:
        while not stepped and time.time() - started < timeout and local.poll() is None:
            parent = psutil.Process(local.pid)
            cpu["local"] = sum(parent.cpu_times()[:2])
            for child in parent.children():
                try:
                    cmdline = child.cmdline()
                    name = Path(cmdline[cmdline.index("--ready-file") + 1]).stem
                    children.setdefault(name, child.create_time() - started)
                    cpu[name] = sum(child.cpu_times()[:2])
                except (psutil.Error, ValueError, IndexError):
                    continue
            for ready in (run_dir / "ready").glob("actor-*.json"):
                try:
                    stepped = max(stepped, first_step(ready))
                except (OSError, ValueError, KeyError):
                    pass
            time.sleep(0.02)
    finally:
        local.send_signal(signal.SIGINT)
        local.wait(120)
    ready = {p.stem: p.stat().st_mtime - started for p in (run_dir / "ready").glob("*.json")}
    shutil.rmtree(run_dir)
    return {
        "algorithm": algorithm,
        "env": env,
        "first_env_step": round(stepped - started, 3) if stepped else None,
        "process_start": {k: round(v, 3) for k, v in sorted(children.items())},
        "ready": {k: round(v, 3) for k, v in sorted(ready.items())},
        "cpu_seconds": {k: round(v, 2) for k, v in sorted(cpu.items())},
        "load_1min": round(os.getloadavg()[0], 2),
    }


def imports(top: int) -> None:
    for service, module in SERVICES.items():
        code = f"import apexrl.cli, {module}"
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-X", "importtime", "-c", code],
                              capture_output=True, text=True, check=True)  # fmt: skip
        wall = time.perf_counter() - started
        rows = []
        for line in done.stderr.splitlines():
            found = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)", line)
            if found:
                rows.append((int(found.group(2)), len(found.group(3)), found.group(4)))
        roots = sorted((r for r in rows if r[1] <= 1), reverse=True)[:top]
        slowest = ", ".join(f"{name} {us / 1e6:.2f}" for us, _, name in roots)
        print(json.dumps({"service": service, "wall_seconds": round(wall, 2), "slowest": slowest}))


LEARNER_BUILD = """
import sys, time
from apexrl import algorithms, config as cfg
from apexrl.common.serving import new_registry
from apexrl.learner import server
config = cfg.parse(cfg.LearnerConfig, ["--replay", "127.0.0.1:1"], "learner", "apexrl learner",
                   algorithms.REGISTRY)
before, started = "torch._dynamo" in sys.modules, time.process_time()
server.build(config, new_registry())
print(time.process_time() - started, before, "torch._dynamo" in sys.modules)
"""


def cpu_seconds(code: str) -> list[str]:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return done.stdout.split()


def import_costs() -> None:
    timed = "import time; t = time.process_time(); import {}; print(time.process_time() - t)"
    (torch,) = cpu_seconds(timed.format("torch"))
    (dynamo,) = cpu_seconds("import torch; " + timed.format("torch._dynamo"))
    build, had, has = cpu_seconds(LEARNER_BUILD)
    print(json.dumps({"import_torch_cpu": round(float(torch), 2),
                      "import_dynamo_after_torch_cpu": round(float(dynamo), 2),
                      "learner_build_cpu": round(float(build), 2),
                      "build_imported_dynamo": had == "False" and has == "True"}))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", nargs="+", default=["dqn:CartPole-v1", "ppo:CartPole-v1"],
                        help="ALGORITHM:ENV pairs")  # fmt: skip
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--imports", action="store_true", help="import times per service instead")
    parser.add_argument("--top", type=int, default=6)
    parser.add_argument("--variant", action="append", default=[], help="NAME=DIR (see above)")
    args = parser.parse_args()
    if args.imports:
        imports(args.top)
        import_costs()
        return
    variants = dict(v.split("=", 1) for v in args.variant) or {"installed": ""}
    firsts: dict[str, list[float]] = {}
    for _ in range(args.repeats):
        for pair in args.runs:
            algorithm, env = pair.split(":", 1)
            for name, path in variants.items():
                result = {"variant": name, **one_run(algorithm, env, args.timeout, path)}
                print(json.dumps(result), flush=True)
                if result["first_env_step"] is not None:
                    firsts.setdefault(f"{name} {pair}", []).append(result["first_env_step"])
    for key, values in firsts.items():
        print(f"{key}: first env step {statistics.median(values):.2f} s after the command"
              f" (median of {len(values)}: {', '.join(f'{v:.2f}' for v in values)})")  # fmt: skip


if __name__ == "__main__":
    main()
