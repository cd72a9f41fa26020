"""Shared test harness: real replay servers on port 0, in a thread or as a real process."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import prometheus_client
import pytest

from apexrl.common.serving import serve
from apexrl.config import ReplayConfig
from apexrl.replay import server as replay_server
from apexrl.replay.client import ReplayClient


@pytest.fixture
def one_torch_thread():
    """Small networks gain nothing from torch's threads, which on a busy machine wait on each
    other: the tests that train them run on one thread (pytestmark usefixtures)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def wait_for(predicate: Callable[[], object], timeout: float, what: str, interval: float = 0.02):
    """Polls a condition until it holds (returns its value) or fails the test after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


class Throttle:
    """Keeps a process stopped `stopped` of every `period` seconds (SIGSTOP, then SIGCONT) until
    stop(), as a slow env would pace an actor."""

    def __init__(self, pid: int, period: float = 0.5, stopped: float = 0.9):
        self.pid, self.period, self.stopped = pid, period, stopped
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.done.is_set():
            os.kill(self.pid, signal.SIGSTOP)
            self.done.wait(self.period * self.stopped)
            os.kill(self.pid, signal.SIGCONT)
            self.done.wait(self.period * (1 - self.stopped))

    def stop(self) -> None:
        self.done.set()
        self.thread.join(5)
        try:
            os.kill(self.pid, signal.SIGCONT)
        except ProcessLookupError:  # it already exited
            pass


def metrics(port: int, host: str = "127.0.0.1") -> dict[str, float]:
    """Every sample of a /metrics endpoint, summed over label sets, by name."""
    text = urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5).read().decode()
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name = line.split("{", 1)[0].split(" ", 1)[0]
            values[name] = values.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return values


def metric(port: int, name: str, host: str = "127.0.0.1") -> float:
    """One metric's samples summed over label sets (0 when absent)."""
    return metrics(port, host).get(name, 0.0)


def require_root_feature(missing: str | None) -> None:
    """Skips a test that needs root-only machinery (tmpfs mounts, network namespaces) when it is
    `missing` here; fails it instead under APEXRL_REQUIRE_ROOT=1 (CI runs as root)."""
    if missing is None:
        return
    if os.environ.get("APEXRL_REQUIRE_ROOT") == "1":
        pytest.fail(f"APEXRL_REQUIRE_ROOT=1 but {missing}")
    pytest.skip(missing)


def read_ready_file(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def transitions(n: int, start: int = 0, obs_dim: int = 4) -> dict[str, np.ndarray]:
    """CartPole-shaped columns whose values encode their insertion index (start + i)."""
    index = np.arange(start, start + n)
    obs = (index[:, None] + np.arange(obs_dim)[None, :] / 10).astype(np.float32)
    return {
        "obs": obs,
        "action": (index % 2).astype(np.int64),
        "reward": np.ones(n, np.float32),
        "discount": np.full(n, 0.99, np.float32),
        "next_obs": obs + 1,
    }


def unroll_learning(config, size: int):
    """An impala or ppo learner for config and a batch of `size` random unrolls of its columns,
    as the replay hands them over (torch tensors, actions 0 or 1)."""
    import torch

    from apexrl import algorithms

    builder = algorithms.make(config)
    learning = builder.learning(config, torch.device("cpu"))
    rng = np.random.default_rng(0)
    batch = {c.name: torch.from_numpy(rng.random((size, *c.shape)).astype(c.dtype))
             for c in builder.columns()}  # fmt: skip
    length = builder.settings.unroll_length
    batch["actions"] = torch.from_numpy(rng.integers(0, 2, (size, length)))
    return learning, batch


def cartpole_transitions(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Random CartPole-shaped 3-step transitions, for a learner to train on."""
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(n, 4)).astype(np.float32)
    return {
        "obs": obs,
        "action": rng.integers(2, size=n),
        "reward": np.ones(n, np.float32),
        "discount": np.full(n, 0.99**3, np.float32),
        "next_obs": obs + rng.normal(scale=0.1, size=(n, 4)).astype(np.float32),
    }


def checkpoint_digest(path) -> str:
    """The digest of the table a replay checkpoint file holds (a directory: its newest),
    restored offline; compare with Info's digest of a live table."""
    from apexrl.replay import checkpoint
    from apexrl.replay.table import Table

    path = Path(path)
    states = checkpoint.load_newest(path)[1] if path.is_dir() else checkpoint.read_checkpoint(path)
    (state,) = states
    return Table.from_state(state).digest()


@dataclass
class InProcessReplay:
    """A replay server running its asyncio loop in a thread of the test process."""

    address: str
    metrics_port: int
    servicer: replay_server.ReplayServicer

    @property
    def table(self):
        return self.servicer.tables["default"]

    def client(self, **kwargs) -> ReplayClient:
        kwargs.setdefault("timeout", 10.0)
        kwargs.setdefault("retry_seconds", 5.0)
        return ReplayClient(self.address, **kwargs)


@contextmanager
def serving_in_thread(config, service, registry) -> Iterator[dict]:
    """`serve` (the shared bootstrap) on an asyncio loop in a thread; yields the bound ports.

    config.ready_file must be set: the ports are read from it.
    """
    ready = Path(config.ready_file)
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            loop.run_until_complete(serve(config, service, registry, stop))
        except BaseException as err:  # surfaced by the context manager
            errors.append(err)
        finally:
            loop.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    ports = wait_for(lambda: errors or read_ready_file(ready), 20, "server thread to serve")
    if errors:
        raise errors[0]
    try:
        yield ports
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(30)
        assert not thread.is_alive(), "server thread did not stop"
        if errors:
            raise errors[0]


@contextmanager
def in_process_replay(tmp_path: Path, **settings) -> Iterator[InProcessReplay]:
    ready = tmp_path / f"ready-{time.monotonic_ns()}.json"
    defaults = dict(host="127.0.0.1", port=0, metrics_port=0, grace_seconds=2.0)
    if not settings.get("tables"):  # the flat settings are its one table
        defaults["min_size_to_sample"] = 1
    config = ReplayConfig(**{**defaults, **settings, "ready_file": str(ready)})
    registry = prometheus_client.CollectorRegistry()
    service, servicer = replay_server.build(config, registry)
    with serving_in_thread(config, service, registry) as ports:
        yield InProcessReplay(f"127.0.0.1:{ports['port']}", ports["metrics_port"], servicer)


@pytest.fixture
def replay(tmp_path) -> Iterator[InProcessReplay]:
    with in_process_replay(tmp_path) as harness:
        yield harness


@pytest.fixture
def replay_factory(tmp_path):
    """Starts in-process replay servers with given settings; all stopped after the test."""
    with ExitStack() as stack:
        yield lambda **settings: stack.enter_context(in_process_replay(tmp_path, **settings))


@dataclass
class ServiceProcess:
    """`apexrl <command>` as a real child process."""

    process: subprocess.Popen
    ports: dict
    log_path: Path
    host: str = "127.0.0.1"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.ports['port']}"

    @property
    def metrics_port(self) -> int:
        return self.ports["metrics_port"]

    def log(self) -> str:
        return self.log_path.read_text()

    def terminate(self, timeout: float = 30) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout)

    def stop(self, timeout: float = 30) -> None:
        """SIGTERM; fails the test, showing the log's end, unless it exits 0 in time."""
        code = self.terminate(timeout)
        assert code == 0, f"{self.log_path.name} exited with {code}:\n{self.log()[-3000:]}"

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(10)


def start_service(
    tmp_path: Path, command: str, *flags: str, host: str = "127.0.0.1", prefix: tuple = ()
) -> ServiceProcess:
    """Starts `apexrl command` bound to `host` with free ports and waits until it serves.

    prefix: a command that execs the service, e.g. ("ip", "netns", "exec", NAME).
    """
    stamp = time.monotonic_ns()
    ready, log_path = tmp_path / f"ready-{stamp}.json", tmp_path / f"{command}-{stamp}.log"
    args = [*prefix, sys.executable, "-m", "apexrl.cli", command, "--host", host]
    args += ["--metrics-port", "0", "--ready-file", str(ready)]
    if command in ("replay", "learner", "relay") and "--port" not in flags:
        args += ["--port", "0"]
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [*args, *flags], stdout=log, stderr=subprocess.STDOUT, env=os.environ.copy()
        )
    try:
        ports = wait_for(
            lambda: process.poll() is not None or read_ready_file(ready),
            60,
            f"{command} process to serve",
        )
        if process.poll() is not None:
            pytest.fail(f"{command} exited with {process.returncode}:\n{log_path.read_text()}")
    except BaseException:
        if process.poll() is None:
            process.kill()
            process.wait(10)
        raise
    return ServiceProcess(process, ports, log_path, host)


@pytest.fixture
def service_process(tmp_path):
    """Factory for service child processes; any still running after the test are killed."""
    started: list[ServiceProcess] = []

    def start(command: str, *flags: str) -> ServiceProcess:
        started.append(start_service(tmp_path, command, *flags))
        return started[-1]

    yield start
    for proc in started:
        if proc.process.poll() is None:
            proc.kill()


@pytest.fixture
def filled_replay(service_process) -> "ServiceProcess":
    """A replay process holding 2,000 CartPole transitions, ready to sample (min size 100)."""
    replay = service_process("replay", "--min-size-to-sample", "100")
    with ReplayClient(replay.address) as client:
        client.insert(cartpole_transitions(2000))
    return replay


@pytest.fixture
def replay_process(service_process):
    return lambda *flags: service_process("replay", *flags)


@contextmanager
def serve_in_thread(tmp_path, service, registry, **settings_) -> Iterator[str]:
    """`serve` (the shared bootstrap: interceptor, limits, health) in a thread; yields its address."""
    from apexrl.config import ServeConfig

    ready = tmp_path / f"ready-{time.monotonic_ns()}.json"
    config = ServeConfig(
        host="127.0.0.1", port=0, metrics_port=0, grace_seconds=1.0, ready_file=str(ready)
    )
    for key, value in settings_.items():
        setattr(config, key, value)
    with serving_in_thread(config, service, registry) as ports:
        yield f"127.0.0.1:{ports['port']}"


@contextmanager
def serve_learner(tmp_path, store, arrays: dict, config, **settings_) -> Iterator[tuple]:
    """The real LearnerServicer behind `serve`, in a thread, without a training loop: the test
    publishes into `store`; best-model reports must match `arrays`. Yields (address, servicer)."""
    from apexrl import algorithms  # imports torch
    from apexrl.common.long_poll import add_learner_service
    from apexrl.common.serving import Service
    from apexrl.learner.best import BestModel
    from apexrl.learner.leases import Leases
    from apexrl.learner.servicer import LearnerServicer
    from apexrl.v1 import learner_pb2

    registry = prometheus_client.CollectorRegistry()
    gauge = prometheus_client.Gauge("live_actors", "Actors holding a lease.", registry=registry)
    best = BestModel(config, arrays)
    servicer = LearnerServicer(store, Leases(30.0), gauge, best, algorithms.make(config))

    def register(server) -> list[str]:
        add_learner_service(servicer, server)
        return [learner_pb2.DESCRIPTOR.services_by_name["Learner"].full_name]

    with serve_in_thread(tmp_path, Service(register=register), registry, **settings_) as address:
        yield address, servicer
