"""The actor: the algorithm's behaviour policy on a local copy of its parameters, the items its
adder makes, with initial priorities, to replay.

Stateless: every actor process is configured the same; its exploration parameter (whatever
the algorithm calls it) comes from the lease the learner hands out with parameters (see
protos/apexrl/v1/learner.proto). It never blocks on the network: parameters are pulled by a
background thread, and inserts go through a bounded buffer drained by another thread that
reconnects forever (the oldest items are dropped and counted when the buffer is full).

    envs → policy.step (batched) → adder → policy.priorities → buffer → replay

When parameters change follows the algorithm (Builder.parameter_sync): every `pull_interval`
env steps, or after each item the adder completes (taken only where the adder allows, so an
item is one version's), optionally waiting for a version newer than the last item's.
"""

import collections
import logging
import math
import threading
import time
import uuid

import numpy as np
import prometheus_client

from apexrl import algorithms
from apexrl.actor.parameters import ParameterPuller
from apexrl.algorithms.base import Step
from apexrl.algorithms.columns import pack
from apexrl.algorithms.envs import (
    RETURN_BUCKETS,
    EnvOptions,
    final_observations,
    make_vector_env,
)
from apexrl.common import codec
from apexrl.common.backoff import Backoff
from apexrl.common.client import short_error
from apexrl.common.codec import Packed
from apexrl.common.learner_client import LearnerClient, Parameters
from apexrl.common.memory import off_heap, release_free_memory
from apexrl.config import ActorConfig
from apexrl.replay.client import Replay
from apexrl.replay.sharded import connect
from apexrl.schedules import Schedule

log = logging.getLogger(__name__)

LENGTH_BUCKETS = (10, 25, 50, 100, 200, 500, 1000, 5000, 10000, 30000)
HELD_CHUNK_BYTES = 256 * 1024  # an outage's batches are held merged up to this size
# At a stop, what is buffered gets this long to land. A replay that takes inserts answers in
# milliseconds; one whose rate limiter holds them (a learner sampling slower than the actor
# inserts) would hold the stop for as long as the learner takes: those batches are dropped.
STOP_FLUSH_SECONDS = 0.3


def exploration(setting: float, lease: float, env_steps: int) -> float:
    """An actor's exploration parameter: its own `exploration` setting where it has one (a
    number, or a schedule over its env steps, read at each parameter pull), else its place on
    the learner's ladder (`lease`)."""
    if isinstance(setting, Schedule):
        return setting.value(env_steps)
    return lease if math.isnan(setting) else setting


class ActorMetrics:
    def __init__(
        self,
        registry: prometheus_client.CollectorRegistry,
        exploration_name: str,
        exploration_help: str,
    ):
        self.registry = registry  # where they are read back (get_sample_value)

        def metric(kind, name, doc, **kw):
            return kind(f"apexrl_actor_{name}", doc, registry=registry, **kw)

        C, G, H = prometheus_client.Counter, prometheus_client.Gauge, prometheus_client.Histogram
        self.env_steps = metric(C, "env_steps", "Environment steps taken.")
        self.first_step = metric(
            G, "first_step_timestamp_seconds", "Unix time of the actor's first env step (0: none)."
        )
        self.episodes = metric(C, "episodes", "Episodes finished.")
        self.episode_return = metric(
            H, "episode_return", "Undiscounted episode return.", buckets=RETURN_BUCKETS
        )
        self.episode_length = metric(
            H, "episode_length", "Episode length in steps.", buckets=LENGTH_BUCKETS
        )
        # The algorithm's exploration parameter under its own name (Builder.exploration_name):
        # a metric keeps one meaning whatever the algorithm.
        self.exploration = metric(G, exploration_name, exploration_help)
        self.actor_index = metric(
            G, "ladder_index", "This actor's place in the exploration ladder."
        )
        self.version = metric(G, "parameter_version", "Parameter version the actor acts with.")
        self.lag = metric(
            G, "parameter_lag", "Learner's newest version minus the actor's, at the last pull."
        )
        # "transitions": the adder's items, whatever they hold, as every dashboard names them.
        self.inserted = metric(C, "transitions_inserted", "Items acknowledged by replay.")
        self.dropped = metric(
            C, "transitions_dropped", "Items dropped: buffer full while replay was unreachable."
        )
        self.buffered = metric(G, "transitions_buffered", "Items waiting to be inserted.")
        self.pull_failures = metric(C, "parameter_pull_failures", "Parameter pulls that failed.")
        self.relay_fallbacks = metric(
            C,
            "parameter_relay_fallbacks",
            "Times no parameter relay answered a pull: the learner serves pulls for a while.",
        )
        self.frame_raw_bytes = metric(
            C, "frame_raw_bytes", "Bytes of the observations compressed (Atari), before."
        )
        self.frame_compressed_bytes = metric(
            C, "frame_compressed_bytes", "Bytes of the observations compressed (Atari), after."
        )


class InsertBuffer:
    """Bounded FIFO of transition batches, drained into replay by a thread that never gives up.

    While replay is reachable, `put` applies backpressure: it waits until at most
    `in_flight` batches are queued, so a replay rate limiter slows the actor down instead of
    the actor racing ahead. While replay is unreachable, `put` never waits: the buffer
    grows to `limit` transitions, then drops the oldest and counts them.
    """

    def __init__(
        self,
        replay: Replay,
        limit: int,
        metrics: ActorMetrics,
        stop: threading.Event,
        in_flight: int = 2,
    ):
        self.replay, self.limit, self.metrics, self.stop = replay, limit, metrics, stop
        self.in_flight = in_flight
        self._batches: collections.deque = collections.deque()
        self._count = 0
        self._cond = threading.Condition()
        self._closing = False
        self._outage = False
        self._backlog = False  # batches were held for an outage and not all landed yet
        self._thread = threading.Thread(target=self._drain, name="insert", daemon=True)
        self._thread.start()

    def put(self, columns: dict[str, np.ndarray], priorities: np.ndarray) -> None:
        with self._cond:
            while not self._cond.wait_for(
                lambda: self._outage or len(self._batches) < self.in_flight, timeout=0.05
            ):  # the stop is set by this thread's own signal handler: it cannot notify
                if self.stop.is_set():
                    break
            if self._outage:
                self._hold(columns, priorities)
            else:
                self._batches.append((columns, priorities))
            self._count += len(priorities)
            while self._count > self.limit and len(self._batches) > 1:
                _, dropped = self._batches.popleft()
                self._count -= len(dropped)
                self.metrics.dropped.inc(len(dropped))
            self.metrics.buffered.set(self._count)
            self._cond.notify_all()

    def _hold(self, columns: dict[str, np.ndarray], priorities: np.ndarray) -> None:
        """Holds a batch while replay is away, merged with the newest held one up to
        HELD_CHUNK_BYTES, in memory of its own (memory.off_heap): thousands of small batches
        in malloc's heap and Python's object pools, between what the actor allocates
        meanwhile, would stay in its RSS after they have landed
        (docs/experiments/soak.md#what-changed-for-the-actors)."""
        newest = self._batches[-1] if len(self._batches) > 1 else None  # [0] may be in flight
        # Chunks of at most a 16th of the limit: dropping the oldest, should it be the one on
        # its way (it may land), costs no more than that.
        items = len(priorities) + (len(newest[1]) if newest else 0)
        if (
            newest
            and items <= self.limit // 16
            and codec.nbytes(newest[0]) + codec.nbytes(columns) <= HELD_CHUNK_BYTES
        ):
            self._batches.pop()
            columns = codec.concat([newest[0], columns])
            priorities = np.concatenate([newest[1], priorities])
        self._batches.append(off_heap(columns, priorities))

    def _drain(self) -> None:
        backoff = Backoff()
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._batches or self._closing)
                if not self._batches:
                    return
                columns, priorities = self._batches[0]
            try:
                self.replay.insert(columns, priorities)
            except Exception as err:  # replay away or refusing: keep the batch, retry later
                if self._closing:
                    return
                delay = backoff.next_delay()
                log.warning("insert failed (%s); retrying in %.2f s", short_error(err), delay)
                with self._cond:
                    self._outage = self._backlog = True
                    self._cond.notify_all()
                    self._cond.wait(delay)
                continue
            backoff.reset()
            with self._cond:
                self._outage = False
                if self._batches and self._batches[0][1] is priorities:
                    self._batches.popleft()
                    self._count -= len(priorities)
                self.metrics.buffered.set(self._count)
                drained = self._backlog and not self._batches
                self._backlog &= not drained
                self._cond.notify_all()
            self.metrics.inserted.inc(len(priorities))
            if drained:  # the backlog's memory goes back to the OS, not to the RSS high-water
                release_free_memory()

    def close(self, flush_seconds: float) -> None:
        """Gives the buffer up to flush_seconds to drain, then stops the thread; with the
        replay away it does not wait (nothing would land: a stop would only take longer)."""
        deadline = time.monotonic() + flush_seconds
        with self._cond:
            self._cond.wait_for(
                lambda: not self._batches or self._outage, max(0.0, deadline - time.monotonic())
            )
            self._closing = True
            self._cond.notify_all()
        self.replay.close()
        self._thread.join(5)


def relay_addresses(setting: str) -> list[str]:
    """The `parameters` setting's relay addresses, in order."""
    return [address.strip() for address in setting.split(",") if address.strip()]


def register_metrics(
    config: ActorConfig, registry: prometheus_client.CollectorRegistry
) -> ActorMetrics:
    """The actor's metrics, registered before the process says it is ready (its ready file):
    every scrape from the first on sees them."""
    builder = algorithms.get(config.algorithm)
    return ActorMetrics(registry, builder.exploration_name, builder.exploration_help)


def run(
    config: ActorConfig,
    registry: prometheus_client.CollectorRegistry,
    stop: threading.Event,
    metrics: ActorMetrics | None = None,
) -> None:
    actor = Actor(config, metrics or register_metrics(config, registry), stop)
    try:
        actor.loop()
    finally:
        actor.close()


class Actor:
    """One actor process's envs, policy, adder and its two helper threads."""

    def __init__(self, config: ActorConfig, metrics: ActorMetrics, stop: threading.Event):
        self.config, self.metrics, self.stop = config, metrics, stop
        actor_id = uuid.uuid4().hex
        seed = config.seed or int.from_bytes(uuid.uuid4().bytes[:4], "little")
        seed += int(actor_id[:6], 16)
        self.rng = np.random.default_rng(seed)
        self.builder = builder = algorithms.make(config)
        self.sync = builder.parameter_sync
        self.policy = builder.policy()
        algorithms.set_torch_threads(config.threads)
        # The first adder paces the actor; the others fill their own tables from the same steps.
        self.adder, *others = builder.adders(config.num_envs, self.policy)
        self.columns = builder.table_columns(self.adder.table)
        options = EnvOptions.of(config)
        self.envs, self.obs = make_vector_env(config.env, config.num_envs, seed % 2**31, options)
        self.policy.episode_starts(np.ones(config.num_envs, bool))
        replay = connect(
            config.replay,
            table=self.adder.table,
            timeout=30.0,
            retry_seconds=1.0,
            tls=config,
            stop=stop,
        )
        self.buffer = InsertBuffer(replay, config.buffer_limit, metrics, stop)
        self.others = [
            Outlet(
                adder,
                builder.table_columns(adder.table),
                InsertBuffer(
                    connect(
                        config.replay,
                        table=adder.table,
                        timeout=30.0,
                        retry_seconds=1.0,
                        tls=config,
                        stop=stop,
                    ),
                    config.buffer_limit,
                    metrics,
                    stop,
                ),
            )
            for adder in others
        ]
        # Tries at most 0.1 s apart: an actor that starts before the learner serves (local mode
        # starts every process at once) slept up to 0.6 s past the moment it could have begun.
        learner = LearnerClient(
            config.learner, retry_seconds=1.0, retry_cap=0.1, tls=config, stop=stop
        )
        # Relays are tried once each: one that is away costs a pull from the learner instead.
        relays = [
            LearnerClient(address, retry_seconds=0.0, tls=config, stop=stop)
            for address in relay_addresses(config.parameters)
        ]
        self.puller = ParameterPuller(learner, actor_id, metrics, relays)
        log.info(
            "actor %s: %s x%d, waiting for parameters from %s",
            actor_id[:8],
            config.env,
            config.num_envs,
            ", ".join([*(r.address for r in relays), config.learner]),
        )
        self.exploration, self.version, self.have_weights = 0.0, 0, False
        self.acted, self.waiting = 0, 0.0  # the version of the last item; since when it waits
        self.pending: list[dict[str, np.ndarray]] = []
        self.pending_count = self.steps_since_pull = self.steps = 0
        self.lives = None  # Atari lives, for life_loss_terminal
        self.returns = np.zeros(config.num_envs)
        self.lengths = np.zeros(config.num_envs, np.int64)

    def loop(self) -> None:
        self.puller.request()
        while not self.stop.is_set():
            if self.ready_to_act():
                self.step()

    def ready_to_act(self) -> bool:
        """Takes new parameters where the adder allows; False while the actor must wait (no
        parameters yet, or a version newer than its last item's)."""
        if self.puller.error is not None:  # a setting that cannot work
            raise self.puller.error
        params = self.puller.take() if self.at_boundary else None
        if params is not None:
            self.take(params)
        if not self.have_weights:  # nothing to act with yet: wait for the first pull
            self.stop.wait(0.05)
            return False
        if self.sync.newer_each_item and self.at_boundary and self.version <= self.acted:
            # This version has had its item; wait for the next, for a while (should the learner
            # lack items of this version, e.g. an actor died, act again).
            self.waiting = self.waiting or time.monotonic()
            left = self.sync.wait_seconds - (time.monotonic() - self.waiting)
            if left > 0:
                self.puller.request(wait_seconds=left)  # answered when the learner publishes
                self.puller.arrived.wait(min(left, 0.05))  # 0.05: stays responsive to stop
                return False
        self.waiting = 0.0
        return True

    @property
    def at_boundary(self) -> bool:
        return self.adder.at_boundary and all(o.adder.at_boundary for o in self.others)

    def take(self, params: Parameters) -> None:
        if params.algorithm != self.builder.name:  # acting on them would be nonsense
            raise ValueError(
                f"algorithm: this actor runs {self.builder.name}, the learner at"
                f" {self.config.learner} runs {params.algorithm}"
            )
        if params.arrays:
            self.policy.load(params.arrays)
            self.version, self.have_weights = params.version, True
            self.metrics.version.set(self.version)
        self.exploration = exploration(self.config.exploration, params.exploration, self.steps)
        self.metrics.exploration.set(self.exploration)
        self.metrics.actor_index.set(params.actor_index)

    def step(self) -> None:
        config, obs = self.config, self.obs
        actions, extras = self.policy.step(obs, self.exploration, self.rng)
        next_obs, rewards, terminated, truncated, infos = self.envs.step(actions)
        done = terminated | truncated
        # What the learner learns from; the metrics report the game's rewards.
        learned = np.clip(rewards, -1.0, 1.0) if self.builder.spec.clip_rewards else rewards
        ends = terminated
        if config.life_loss_terminal and "lives" in infos:
            # A life lost ends the returns (discount 0), not the game: the env goes on.
            lost = self.lives is not None and (infos["lives"] < self.lives) & ~done
            ends = terminated | lost
            self.lives = infos["lives"]
        final_obs = final_observations(next_obs, infos) if done.any() else next_obs
        step = Step(
            obs,
            actions,
            extras,
            np.asarray(learned, np.float32),
            ends,
            truncated,
            next_obs,
            final_obs,
            self.version,
        )
        items = self.adder.add(step)
        for outlet in self.others:
            outlet.add(step, self.policy, config, self.metrics)
        self.obs = next_obs
        if done.any():  # SAME_STEP autoreset: next_obs begins their new episodes
            self.policy.episode_starts(done)
        self.count(rewards, done)
        if items is not None:
            self.pending.append(items)
            self.pending_count += len(next(iter(items.values())))
            if not self.sync.periodic:  # new parameters for the next item
                self.acted = self.version
                self.puller.request(self.sync.wait_seconds if self.sync.newer_each_item else 0)
        if self.pending_count >= config.insert_batch or (
            self.adder.insert_at_once and self.pending
        ):
            self.insert()
        self.steps_since_pull += config.num_envs
        self.steps += config.num_envs
        if self.sync.periodic and self.steps_since_pull >= config.pull_interval:
            self.puller.request()
            self.steps_since_pull = 0

    def count(self, rewards: np.ndarray, done: np.ndarray) -> None:
        m = self.metrics
        self.returns += rewards
        self.lengths += 1
        for i in np.flatnonzero(done):
            m.episode_return.observe(self.returns[i])
            m.episode_length.observe(self.lengths[i])
        m.episodes.inc(int(done.sum()))
        self.returns[done], self.lengths[done] = 0.0, 0
        if self.steps == 0:  # count() runs before step() adds this step to self.steps
            m.first_step.set(time.time())
        m.env_steps.inc(self.config.num_envs)

    def insert(self) -> None:
        insert(
            self.pending,
            self.adder,
            self.policy,
            self.columns,
            self.buffer,
            self.config,
            self.metrics,
        )
        self.pending, self.pending_count = [], 0

    def close(self) -> None:
        self.puller.close()
        for buffer in [self.buffer, *(outlet.buffer for outlet in self.others)]:
            buffer.close(flush_seconds=STOP_FLUSH_SECONDS)
        self.envs.close()


def insert(pending, adder, policy, columns, buffer: InsertBuffer, config, metrics) -> None:
    """The adder's pending items to its buffer: one batch, initial priorities, packed."""
    batch = {k: np.concatenate([p[k] for p in pending]) for k in pending[0]}
    priorities = adder.priorities(batch, policy) + config.priority_epsilon
    packed = pack({k: v for k, v in batch.items() if k not in adder.acting_fields}, columns)
    for value in packed.values():
        if isinstance(value, Packed):
            metrics.frame_raw_bytes.inc(len(value) * value.item_nbytes)
            metrics.frame_compressed_bytes.inc(int(value.sizes.sum()))
    buffer.put(packed, priorities)


class Outlet:
    """An adder besides the actor's first: its items, its table's columns, its insert buffer."""

    def __init__(self, adder, columns, buffer: InsertBuffer):
        self.adder, self.columns, self.buffer = adder, columns, buffer
        self.pending: list[dict[str, np.ndarray]] = []
        self.count = 0

    def add(self, step: Step, policy, config: ActorConfig, metrics: ActorMetrics) -> None:
        items = self.adder.add(step)
        if items is not None:
            self.pending.append(items)
            self.count += len(next(iter(items.values())))
        if self.pending and (self.adder.insert_at_once or self.count >= config.insert_batch):
            insert(self.pending, self.adder, policy, self.columns, self.buffer, config, metrics)
            self.pending, self.count = [], 0
