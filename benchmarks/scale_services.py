"""The services of a scale run (benchmarks/scale.py), each pinned where asked, and what
/proc and their /metrics say of them."""

import json
import math
import os
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from apexrl.replay.client import ReplayClient
from apexrl.replay.sharded import connect


@dataclass
class Service:
    name: str
    process: subprocess.Popen
    address: str
    metrics_port: int


@contextmanager
def service(name: str, command: list[str], folder: Path, core: int | None):
    """`apexrl <command>` on loopback until the block ends, on `core` alone when given."""
    ready = folder / f"{name}.ready.json"
    args = [sys.executable, "-m", "apexrl.cli", *command, "--host", "127.0.0.1", "--port", "0"]
    args += ["--metrics-port", "0", "--ready-file", str(ready), "--log-level", "WARNING"]
    pin = None if core is None else (lambda: os.sched_setaffinity(0, {core}))
    with open(folder / f"{name}.log", "w") as out:
        process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, preexec_fn=pin)
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start:\n{(folder / f'{name}.log').read_text()}")
            time.sleep(0.05)
        ports = json.loads(ready.read_text())
        yield Service(name, process, f"127.0.0.1:{ports['port']}", ports["metrics_port"])
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def prefill(address: str, batches: list[dict], shards: int, min_size: int) -> None:
    """Inserts until every shard can be sampled (its share of min_size_to_sample)."""
    rng = np.random.default_rng(0)
    with connect(address, timeout=30.0) as client:
        for i in range(shards * math.ceil(min_size / shards / 64) * 2 + shards):
            batch = batches[i % len(batches)]
            client.insert(batch, rng.uniform(0.1, 2.0, len(batch["action"])))


def scrape(port: int) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


def cpu_times(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of a process, all its threads."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process, all its threads."""
    return sum(cpu_times(pid))


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmRSS"))


def core_times() -> dict[str, tuple[int, int]]:
    """(busy, total) jiffies of each core, from /proc/stat."""
    out = {}
    with open("/proc/stat") as fh:
        for line in fh:
            name, *values = line.split()
            if name.startswith("cpu") and name != "cpu":
                ticks = [int(v) for v in values[:8]]
                out[name] = (sum(ticks) - ticks[3] - ticks[4], sum(ticks))
    return out


class Probe:
    """CPU seconds by role, RSS and the learner's counters at one moment."""

    def __init__(self, roles: dict[str, list[int]], learner: Service, replays: list[Service]):
        self.t = time.monotonic()
        self.cpu = {role: sum(cpu_seconds(p) for p in pids) for role, pids in roles.items()}
        self.cores = core_times()
        self.learner_rss = rss(learner.process.pid)
        self.replay_rss = sum(rss(r.process.pid) for r in replays)
        metrics = scrape(learner.metrics_port)
        self.updates = metrics.get("apexrl_learner_update_step", 0.0)
        self.version = metrics.get("apexrl_learner_parameter_version", 0.0)
        self.prefetch_wait = metrics.get("apexrl_learner_prefetch_wait_fraction", math.nan)
        self.parameter_bytes = metrics.get("apexrl_learner_parameter_bytes", 0.0)
        self.bytes_sent = metrics.get("apexrl_learner_parameter_bytes_sent_total", 0.0)


def usage(a: Probe, b: Probe) -> dict:
    dt = b.t - a.t
    cores = {
        name: round((b.cores[name][0] - busy) / max(b.cores[name][1] - total, 1), 3)
        for name, (busy, total) in a.cores.items()
    }
    return {
        "cpu_seconds_per_s": {r: round((b.cpu[r] - a.cpu[r]) / dt, 3) for r in a.cpu},
        "core_busy": cores,
    }


def replay_inserts(replays: list[Service]) -> int:
    """Items the shards have taken in, over the whole run."""
    total = 0
    for r in replays:
        with ReplayClient(r.address, timeout=30.0) as client:
            total += client.info().inserts
    return total


def wait_for_updates(learner: Service, updates: int, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while scrape(learner.metrics_port).get("apexrl_learner_update_step", 0.0) < updates:
        if learner.process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the learner did not reach {updates} updates")
        time.sleep(0.5)
