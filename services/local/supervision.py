"""Local mode's child processes: started with the entry points the containers use, told their
peers' ports, and stopped in dependency order."""

import ctypes
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from apexrl.command_config import LocalConfig
from apexrl.common.ports import free_port
from apexrl.local.settings import write_config

log = logging.getLogger(__name__)


def die_with_parent() -> None:
    """In the child: get SIGTERM if local mode dies, even by SIGKILL (Linux)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def cpus_for(name: str, learner_cpu: int) -> set[int] | None:
    """The CPUs service `name` may run on: with learner_cpu >= 0, that one for the learner and
    the others this process may use for every other service; None (no pinning) otherwise.
    ValueError naming learner_cpu where it is not one of this process's CPUs, or is its only
    one."""
    if learner_cpu < 0:
        return None
    allowed = os.sched_getaffinity(0)
    if learner_cpu not in allowed or len(allowed) < 2:
        raise ValueError(
            f"learner_cpu: {learner_cpu} is not one of this machine's CPUs {sorted(allowed)}"
            " beside another (-1: no pinning)"
        )
    return {learner_cpu} if name == "learner" else allowed - {learner_cpu}


def child_setup(cpus: set[int] | None):
    """What a child runs before exec: die with local mode, and keep to `cpus` where given."""

    def setup() -> None:
        die_with_parent()
        if cpus is not None:
            os.sched_setaffinity(0, cpus)

    return setup


@dataclass
class Child:
    name: str
    process: subprocess.Popen
    ports: dict
    ready_file: Path
    episodes: tuple[float, ...] = (0.0, 0.0)  # return sum and count at the previous row

    def metrics(self) -> dict[str, float]:
        """Sum of every sample of every metric, by sample name (none before it is ready)."""
        if not self.ports:
            if not self.ready_file.exists():
                return {}
            self.ports = json.loads(self.ready_file.read_text())
        url = f"http://127.0.0.1:{self.ports['metrics_port']}/metrics"
        with urllib.request.urlopen(url, timeout=2) as response:
            text = response.read().decode()
        totals: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
        return totals


class Run:
    def __init__(self, config: LocalConfig, user_file: dict, run_dir: Path):
        self.config, self.run_dir = config, run_dir
        cpus_for("learner", config.learner_cpu)  # refused before the run folder is made
        self.children: list[Child] = []
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)
        (run_dir / "ready").mkdir(exist_ok=True)
        self.settings = write_config(config, user_file, run_dir)
        self.checkpoint_dir = Path(self.settings["learner"]["checkpoint_dir"])
        self.config_path = run_dir / "config.toml"

    def launch(self, name: str, command: str, *flags: str) -> Child:
        ready = self.run_dir / "ready" / f"{name}.json"
        ready.unlink(missing_ok=True)  # a reused run folder holds the previous run's ports
        args = [sys.executable, "-m", "apexrl.cli", command, "--config", str(self.config_path)]
        args += ["--host", "127.0.0.1", "--metrics-port", "0", "--ready-file", str(ready), *flags]
        with open(self.run_dir / "logs" / f"{name}.log", "w") as log_file:
            setup = child_setup(cpus_for(name, self.config.learner_cpu))
            process = subprocess.Popen(
                args, stdout=log_file, stderr=subprocess.STDOUT, preexec_fn=setup
            )
        child = Child(name, process, {}, ready)
        self.children.append(child)
        return child

    def wait_ready(self, children: list[Child], timeout: float = 120) -> None:
        """Waits until each child has written its ready file (its ports)."""
        deadline = time.monotonic() + timeout
        for child in children:
            while not child.ready_file.exists():
                if child.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"{child.name} did not start; see {self.run_dir}/logs/{child.name}.log"
                    )
                time.sleep(0.05)
            child.ports = json.loads(child.ready_file.read_text())

    launched = 0.0  # unix time start_all began
    learner_address = ""
    evaluator: Child | None = None

    def start_all(self, wait: bool = True) -> None:
        """Starts the replay, the learner and the actors at once (imports dominate start-up),
        then waits until all serve (wait=False: the caller calls wait_ready). The evaluator
        comes next (start_evaluator), once the learner serves: on two cores its imports would
        otherwise compete with the learner's (torch) on the way to the first version, which it
        needs to play anything; and it is there for the first versions, which it plays in
        order where the algorithm asks for every version to be played (a solving version comes
        within the first seconds of impala on CartPole).

        The gRPC ports are picked here, not by the children (port 0), so that no child has to
        wait for another's ready file before it can be told where its peers are.
        """
        self.launched = time.time()
        shards = self.config.replay_shards
        ports = [free_port() for _ in range(shards)]
        replay_address = ",".join(f"127.0.0.1:{port}" for port in ports)
        self.learner_address = learner_address = f"127.0.0.1:{free_port()}"
        for shard, port in enumerate(ports):
            name = "replay" if shards == 1 else f"replay-{shard}"
            self.launch(name, "replay", "--port", str(port), *self.shard_flags(shard))
        self.launch(
            "learner",
            "learner",
            "--port",
            learner_address.split(":")[1],
            "--replay",
            replay_address,
        )
        for i in range(self.config.actors):
            # Actor i of a seeded run draws its per-actor settings (draws.py) with seed + i: one
            # seed for all would give every actor the same draw.
            seed = ["--seed", str(self.config.seed + i)] if self.config.seed else []
            self.launch(
                f"actor-{i}",
                "actor",
                "--replay",
                replay_address,
                "--learner",
                learner_address,
                *seed,
            )
        if wait:
            self.wait_ready(self.children)

    def start_evaluator(self) -> None:
        """Launches the evaluator without waiting for it (its metrics count once it is ready)."""
        self.evaluator = self.launch("evaluator", "evaluator", "--learner", self.learner_address)

    def shard_flags(self, shard: int) -> list[str]:
        """A shard's id (its tables' sizes are each shard's share already)."""
        return [] if self.config.replay_shards == 1 else ["--shard", str(shard)]

    def stop_all(self, timeout: float = 60) -> None:
        """SIGTERM in dependency order, each group at once: actors and evaluator, then the
        learner (final checkpoint), then the replay shards, so nobody loses the peer it is
        flushing to."""
        replays = [c for c in self.children if c.name.startswith("replay")]
        learner = [c for c in self.children if c.name == "learner"]
        workers = [c for c in self.children if c not in replays and c not in learner]
        groups = [g for g in (workers, learner, replays) if g]
        for group in groups:
            running = [c for c in group if c.process.poll() is None]
            for child in running:
                child.process.send_signal(signal.SIGTERM)
            for child in running:
                try:
                    child.process.wait(timeout)
                except subprocess.TimeoutExpired:
                    log.warning("%s did not stop in %.0f s: killing it", child.name, timeout)
                    child.process.kill()
                    child.process.wait()

    def dead_child(self) -> Child | None:
        return next((c for c in self.children if c.process.poll() is not None), None)


def stop_on_signals() -> tuple[threading.Event, list[int]]:
    """An event SIGTERM and SIGINT set, and the list of the signals received (local mode and
    pbt exit 0 on SIGTERM, 130 on SIGINT)."""
    stop = threading.Event()
    received: list[int] = []

    def interrupt(signum: int, _frame) -> None:
        received.append(signum)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, interrupt)
    return stop, received
