"""The learner: trains from replay in a thread, serves parameters and leases over gRPC.

Three threads keep the training step busy (Acme's shape):
- prefetch: a server-streamed SampleStream from replay, decoded to tensors into a bounded
  queue, so the step waits on the network only when replay cannot keep up;
- train: the double-DQN step; it hands new priorities to
- priorities: writes them back to replay, coalescing what queued up meanwhile, never
  stalling the step.
The asyncio loop serves GetParameters from the newest published version, encoded once.
"""

import asyncio
import dataclasses
import logging
import os
import queue
import secrets
import threading
import time

import grpc
import gymnasium as gym
import numpy as np
import prometheus_client
import torch

from apexrl.actor.epsilon import epsilon_ladder
from apexrl.common import checkpoint, tensors
from apexrl.common.errors import InvalidArgument
from apexrl.common.serving import Service
from apexrl.config import LearnerConfig
from apexrl.learner.best import BestModel
from apexrl.learner.loss import dqn_loss
from apexrl.learner.network import build_network, load_numpy_state, state_to_numpy
from apexrl.replay.client import ReplayClient
from apexrl.v1 import learner_pb2, learner_pb2_grpc, tensor_pb2

log = logging.getLogger(__name__)


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def hidden_sizes(text: str) -> tuple[int, ...]:
    return tuple(int(h) for h in text.split(",") if h.strip())


def make_network(config) -> torch.nn.Module:
    """The Q network every role builds from the shared agent settings and the env's spaces."""
    env = gym.make(config.env)
    try:
        space, actions = env.observation_space, int(env.action_space.n)
    finally:
        env.close()
    return build_network(space.shape, space.dtype, actions, hidden_sizes(config.hidden))


class Leases:
    """Which actors are alive, in the order they arrived: their places in the epsilon ladder."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self._began: dict[str, float] = {}
        self._seen: dict[str, float] = {}
        self._lock = threading.Lock()

    def renew(self, actor_id: str, now: float) -> tuple[int, int]:
        """Renews (or starts) a lease; returns (index, number of live actors)."""
        with self._lock:
            for other, seen in list(self._seen.items()):
                if now - seen > self.seconds:
                    del self._seen[other], self._began[other]
            self._began.setdefault(actor_id, now)
            self._seen[actor_id] = now
            order = sorted(self._began, key=lambda a: (self._began[a], a))
            return order.index(actor_id), len(order)


class ParameterStore:
    """The newest published parameters, encoded once per version.

    `lineage` is random per process: after a kill -9 the resumed learner reissues the version
    numbers published after its last checkpoint, with other weights, under a new lineage.
    """

    def __init__(self):
        self.lineage = secrets.randbits(63) + 1
        self.version = 0
        self.update_step = 0
        self._parameters: dict[str, tensor_pb2.Tensor] = {}
        self._lock = threading.Lock()

    def publish(
        self, arrays: dict[str, np.ndarray], update_step: int, version: int | None = None
    ) -> int:
        encoded = {name: tensors.to_proto(a) for name, a in arrays.items()}
        with self._lock:
            self.version = self.version + 1 if version is None else version
            self.update_step = update_step
            self._parameters = encoded
            return self.version

    def fill(
        self, response: learner_pb2.GetParametersResponse, have_version: int, have_lineage: int
    ) -> None:
        with self._lock:
            response.version, response.update_step = self.version, self.update_step
            response.lineage = self.lineage
            if (have_version, have_lineage) != (self.version, self.lineage):
                for name, tensor in self._parameters.items():
                    response.parameters[name].CopyFrom(tensor)


class LearnerServicer(learner_pb2_grpc.LearnerServicer):
    def __init__(
        self,
        store: ParameterStore,
        leases: Leases,
        live_actors: prometheus_client.Gauge,
        best: BestModel,
    ):
        self.store, self.leases, self.live_actors, self.best = store, leases, live_actors, best

    async def GetParameters(self, request, context):
        if len(request.actor_id) > 128:
            raise InvalidArgument("actor_id", f"{len(request.actor_id)} characters, at most 128")
        if self.store.version == 0:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "no parameters published yet")
        response = learner_pb2.GetParametersResponse(lease_seconds=self.leases.seconds)
        self.store.fill(response, request.have_version, request.have_lineage)
        if request.actor_id:
            index, count = self.leases.renew(request.actor_id, time.monotonic())
            response.actor_index, response.num_actors = index, count
            response.epsilon = epsilon_ladder(index, count)
            self.live_actors.set(count)
        return response

    async def ReportEvaluation(self, request, context):
        return await asyncio.to_thread(self.best.report, request)  # may write a checkpoint


class LearnerMetrics:
    def __init__(self, registry: prometheus_client.CollectorRegistry):
        def gauge(name, doc):
            return prometheus_client.Gauge(f"apexrl_learner_{name}", doc, registry=registry)

        def counter(name, doc):
            return prometheus_client.Counter(f"apexrl_learner_{name}", doc, registry=registry)

        self.updates = counter("updates", "Training updates (SGD steps) done by this process.")
        self.update_step = gauge("update_step", "Update step, kept across restarts.")
        self.loss = gauge("loss", "Importance-weighted Huber loss of the last update.")
        self.td_error = gauge("td_error_mean", "Mean |TD error| of the last batch.")
        self.q_mean = gauge("q_mean", "Mean Q(s, a) of the last batch.")
        self.weight_mean = gauge("is_weight_mean", "Mean importance weight of the last batch.")
        self.weight_min = gauge("is_weight_min", "Smallest importance weight of the last batch.")
        self.version = gauge("parameter_version", "Newest published parameter version.")
        self.wait_fraction = gauge(
            "prefetch_wait_fraction",
            "Fraction of the last 100 updates' wall time the step waited for a batch.",
        )
        self.wait_seconds = counter("prefetch_wait_seconds", "Time the step waited for batches.")
        self.samples = counter("samples_consumed", "Transitions trained on.")
        self.priority_updates = counter("priority_updates_sent", "Priorities written to replay.")
        self.live_actors = gauge("live_actors", "Actors holding a lease.")
        self.checkpoint_failures = counter(
            "checkpoint_failures", "Checkpoints that failed to write (previous ones kept)."
        )


class Learner:
    """Online and target networks, optimizer and counters; trains until told to stop."""

    COALESCE = 16  # at most this many updates' priorities go to replay in one call

    def __init__(self, config: LearnerConfig, metrics: LearnerMetrics, store: ParameterStore):
        self.config, self.metrics, self.store = config, metrics, store
        self.device = pick_device(config.device)
        torch.set_num_threads(config.threads)
        if config.seed:
            torch.manual_seed(config.seed)
        self.online = make_network(config).to(self.device)
        self.target = make_network(config).to(self.device)
        self.target.load_state_dict(self.online.state_dict())
        self.optimizer = torch.optim.Adam(self.online.parameters(), lr=config.learning_rate)
        self.update_step = 0
        self.samples_consumed = 0
        self.stop = threading.Event()
        self.helpers: list[threading.Thread] = []
        self._resume()
        if self.store.version == 0:
            self.publish()

    # --- parameters and checkpoints --------------------------------------------------------

    def publish(self, version: int | None = None) -> None:
        version = self.store.publish(state_to_numpy(self.online), self.update_step, version)
        self.metrics.version.set(version)

    def checkpoint(self) -> None:
        """Publishes, then writes nets, optimizer and counters atomically (no pickle)."""
        if not self.config.checkpoint_dir:
            return
        self.publish()  # the checkpoint's online net is exactly the newest version
        arrays = {f"online/{k}": v for k, v in state_to_numpy(self.online).items()}
        arrays |= {f"target/{k}": v for k, v in state_to_numpy(self.target).items()}
        optimizer = self.optimizer.state_dict()
        for index, state in optimizer["state"].items():
            for key, value in state.items():
                arrays[f"optimizer/{index}/{key}"] = value.detach().cpu().numpy()
        meta = {
            "update_step": self.update_step,
            "version": self.store.version,
            "samples_consumed": self.samples_consumed,
            "param_groups": optimizer["param_groups"],
            "config": dataclasses.asdict(self.config),
        }
        started = time.perf_counter()
        try:
            path, size = checkpoint.write_checkpoint(
                self.config.checkpoint_dir, "learner", meta, arrays
            )
        except OSError as err:  # a full or failing disk: keep training on, keep the old files
            self.metrics.checkpoint_failures.inc()
            log.error("checkpoint failed, previous ones kept: %s", err)
            return
        log.info(
            "checkpoint %s: update %d, version %d, %d bytes in %.2f s",
            path, self.update_step, self.store.version, size, time.perf_counter() - started,
        )  # fmt: skip

    def _resume(self) -> None:
        if not self.config.checkpoint_dir:
            return
        found = checkpoint.load_newest(self.config.checkpoint_dir, "learner")
        if found is None:
            log.info("no learner checkpoint in %s: starting fresh", self.config.checkpoint_dir)
            return
        path, meta, arrays = found

        def part(prefix: str) -> dict[str, np.ndarray]:
            return {k[len(prefix) :]: v for k, v in arrays.items() if k.startswith(prefix)}

        load_numpy_state(self.online, part("online/"))
        load_numpy_state(self.target, part("target/"))
        state: dict[int, dict[str, torch.Tensor]] = {}
        for name, value in part("optimizer/").items():
            index, key = name.split("/")
            state.setdefault(int(index), {})[key] = torch.from_numpy(value.copy())
        self.optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})
        self.update_step = meta["update_step"]
        self.samples_consumed = meta["samples_consumed"]
        self.publish(version=meta["version"])
        self.metrics.update_step.set(self.update_step)
        log.info(
            "resumed from %s: update %d, parameter version %d",
            path, self.update_step, meta["version"],
        )  # fmt: skip

    # --- training ---------------------------------------------------------------------------

    def to_device(self, batch) -> tuple[dict[str, torch.Tensor], torch.Tensor, np.ndarray]:
        columns = {
            name: torch.from_numpy(np.array(array)).to(self.device, non_blocking=True)
            for name, array in batch.columns.items()
        }
        weights = torch.from_numpy(np.array(batch.weights)).to(self.device, non_blocking=True)
        return columns, weights, np.array(batch.keys)

    def train(self, replay: ReplayClient) -> None:
        """Runs until `stop` is set (or max_updates). Call from its own thread."""
        batches: queue.Queue = queue.Queue(maxsize=self.config.prefetch)
        priorities: queue.Queue = queue.Queue()
        threads = [
            threading.Thread(target=self._prefetch, args=(replay, batches), daemon=True),
            threading.Thread(target=self._write_priorities, args=(replay, priorities), daemon=True),
        ]
        self.helpers = threads  # joined on shutdown: none may be inside gRPC when Python exits
        for thread in threads:
            thread.start()
        waited = busy = 0.0
        last_checkpoint = time.monotonic()
        while not self.stop.is_set():
            if self.config.max_updates and self.update_step >= self.config.max_updates:
                log.info(
                    "reached max_updates %d: training stops, parameters still served",
                    self.update_step,
                )
                break
            started = time.perf_counter()
            try:
                item = batches.get(timeout=0.5)
            except queue.Empty:
                continue
            if isinstance(item, BaseException):
                raise item
            waited += time.perf_counter() - started
            self.metrics.wait_seconds.inc(time.perf_counter() - started)
            self._update(*item, priorities)
            busy += time.perf_counter() - started
            if self.update_step % 100 == 0:
                self.metrics.wait_fraction.set(waited / busy if busy else 0.0)
                waited = busy = 0.0
            interval = self.config.checkpoint_interval
            if interval > 0 and time.monotonic() - last_checkpoint > interval:
                self.checkpoint()
                last_checkpoint = time.monotonic()
        priorities.put(None)
        threads[1].join(10)

    def _update(self, columns, weights, keys, priorities: queue.Queue) -> None:
        loss, td_errors, q = dqn_loss(self.online, self.target, columns, weights)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.online.parameters(), self.config.max_grad_norm)
        self.optimizer.step()
        self.update_step += 1
        self.samples_consumed += len(keys)
        new_priorities = (td_errors.abs() + self.config.priority_epsilon).cpu().numpy()
        priorities.put((keys, new_priorities))
        if self.update_step % self.config.target_update_interval == 0:
            self.target.load_state_dict(self.online.state_dict())
        if self.update_step % self.config.publish_interval == 0:
            self.publish()
        m = self.metrics
        m.updates.inc()
        m.update_step.set(self.update_step)
        m.samples.inc(len(keys))
        m.loss.set(loss.item())
        m.td_error.set(float(np.abs(new_priorities - self.config.priority_epsilon).mean()))
        m.q_mean.set(q.mean().item())
        m.weight_mean.set(float(weights.mean()))
        m.weight_min.set(float(weights.min()))

    def _prefetch(self, replay: ReplayClient, batches: queue.Queue) -> None:
        try:
            for batch in replay.sample_stream(self.config.batch_size, self.config.beta):
                item = self.to_device(batch)
                while not self.stop.is_set():
                    try:
                        batches.put(item, timeout=0.5)
                        break
                    except queue.Full:
                        continue
                if self.stop.is_set():
                    return
        except Exception as err:  # surfaced in the training thread
            if not self.stop.is_set():
                batches.put(err)

    def _write_priorities(self, replay: ReplayClient, priorities: queue.Queue) -> None:
        """Writes priorities back, coalescing up to COALESCE updates (or what arrives in 20 ms):
        a replay call costs far more than a few thousand keys do."""
        done = False
        while not done:
            item = priorities.get()
            done = item is None
            pending = [] if done else [item]
            deadline = time.monotonic() + 0.02
            while not done and len(pending) < self.COALESCE:
                try:
                    item = priorities.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if item is None:
                    done = True
                else:
                    pending.append(item)
            if pending:
                keys = np.concatenate([k for k, _ in pending])
                values = np.concatenate([p for _, p in pending])
                try:
                    replay.update_priorities(keys, values)
                    self.metrics.priority_updates.inc(len(keys))
                except Exception as err:  # priorities are advisory: log and carry on
                    if self.stop.is_set():
                        return
                    log.warning("priority update of %d keys failed: %s", len(keys), err)


def build(
    config: LearnerConfig, registry: prometheus_client.CollectorRegistry
) -> tuple[Service, Learner]:
    metrics = LearnerMetrics(registry)
    store, leases = ParameterStore(), Leases(config.lease_seconds)
    learner = Learner(config, metrics, store)
    best = BestModel(config, state_to_numpy(learner.online))
    servicer = LearnerServicer(store, leases, metrics.live_actors, best)
    replay = ReplayClient(config.replay, timeout=30.0, retry_seconds=None, tls=config)

    def train() -> None:
        try:
            learner.train(replay)
        except Exception:
            if learner.stop.is_set():
                return
            # A failing training step is a bug or a broken replay contract: exit non-zero so the
            # supervisor restarts the learner from its last checkpoint.
            log.exception("training failed")
            os._exit(1)

    thread = threading.Thread(target=train, name="train", daemon=True)

    def register(server) -> list[str]:
        learner_pb2_grpc.add_LearnerServicer_to_server(servicer, server)
        return [learner_pb2.DESCRIPTOR.services_by_name["Learner"].full_name]

    async def start_training() -> None:
        thread.start()

    async def stop_training() -> None:
        learner.stop.set()
        replay.close()  # unblocks a prefetch stream the replay rate limiter holds
        await asyncio.to_thread(thread.join)
        for helper in learner.helpers:
            await asyncio.to_thread(helper.join, 10)

    async def final_checkpoint() -> None:
        learner.checkpoint()

    return Service(
        register=register,
        on_shutdown=stop_training,
        on_stop=final_checkpoint,
        background=[start_training],
    ), learner
