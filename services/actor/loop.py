"""The actor: the algorithm's behaviour policy on a local copy of its parameters, n-step
transitions with initial priorities to replay.

Stateless: every actor process is configured the same; its exploration parameter (epsilon
for dqn, the noise scale for dpg) comes from the lease the learner hands out with parameters
(see protos/apexrl/v1/learner.proto). It never blocks on
the network: parameters are pulled by a background thread every `pull_interval` env steps,
and inserts go through a bounded buffer drained by another thread that reconnects forever
(the oldest transitions are dropped and counted when the buffer is full).

    envs → policy.act (batched) → NStepAdder → policy.priorities → buffer → replay

On-policy algorithms (impala, ppo) sample their policy instead and write unrolls
(actor/unroll.py), taking new parameters only between unrolls, so that each unroll is one
version's; for ppo an actor acts one unroll per version and then waits for the next.
"""

import collections
import logging
import threading
import time
import uuid

import numpy as np
import prometheus_client
import torch

from apexrl import algorithms
from apexrl.actor.nstep import NStepAdder
from apexrl.actor.unroll import UnrollAdder, step_targets
from apexrl.algorithms.columns import pack
from apexrl.algorithms.envs import (
    RETURN_BUCKETS,
    EnvOptions,
    final_observations,
    make_vector_env,
)
from apexrl.common.backoff import Backoff
from apexrl.common.codec import Packed
from apexrl.common.learner_client import LearnerClient, Parameters
from apexrl.config import ActorConfig
from apexrl.replay.client import ReplayClient
from apexrl.replay.sharded import ShardedReplayClient, connect

log = logging.getLogger(__name__)

LENGTH_BUCKETS = (10, 25, 50, 100, 200, 500, 1000, 5000, 10000, 30000)
VERSION_WAIT_SECONDS = 1.0  # ppo: how long an actor waits for the version after the one it used


EXPLORATION_HELP = {
    "epsilon": "Exploration epsilon from the actor's lease (dqn).",
    "noise_scale": "Gaussian action-noise std, as a fraction of the action half-range, from the"
    " actor's lease (dpg).",
    "policy_sampling": "1: the actor samples its policy (impala, ppo: no exploration ladder).",
}


class ActorMetrics:
    def __init__(self, registry: prometheus_client.CollectorRegistry, exploration_name: str):
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
        # The algorithm's exploration parameter under its own name (dqn: epsilon, dpg:
        # noise_scale): a metric keeps one meaning whatever the algorithm.
        self.exploration = metric(G, exploration_name, EXPLORATION_HELP[exploration_name])
        self.actor_index = metric(
            G, "ladder_index", "This actor's place in the exploration ladder."
        )
        self.version = metric(G, "parameter_version", "Parameter version the actor acts with.")
        self.lag = metric(
            G, "parameter_lag", "Learner's newest version minus the actor's, at the last pull."
        )
        self.inserted = metric(C, "transitions_inserted", "Transitions acknowledged by replay.")
        self.dropped = metric(
            C,
            "transitions_dropped",
            "Transitions dropped: buffer full while replay was unreachable.",
        )
        self.buffered = metric(G, "transitions_buffered", "Transitions waiting to be inserted.")
        self.pull_failures = metric(C, "parameter_pull_failures", "Parameter pulls that failed.")
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

    def __init__(self, replay: ReplayClient | ShardedReplayClient, limit: int, metrics: ActorMetrics, stop: threading.Event,
                 in_flight: int = 2):  # fmt: skip
        self.replay, self.limit, self.metrics, self.stop = replay, limit, metrics, stop
        self.in_flight = in_flight
        self._batches: collections.deque = collections.deque()
        self._count = 0
        self._cond = threading.Condition()
        self._closing = False
        self._outage = False
        self._thread = threading.Thread(target=self._drain, name="insert", daemon=True)
        self._thread.start()

    def put(self, columns: dict[str, np.ndarray], priorities: np.ndarray) -> None:
        with self._cond:
            while not self._cond.wait_for(
                lambda: self._outage or len(self._batches) < self.in_flight, timeout=0.2
            ):
                if self.stop.is_set():
                    break
            self._batches.append((columns, priorities))
            self._count += len(priorities)
            while self._count > self.limit and len(self._batches) > 1:
                _, dropped = self._batches.popleft()
                self._count -= len(dropped)
                self.metrics.dropped.inc(len(dropped))
            self.metrics.buffered.set(self._count)
            self._cond.notify_all()

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
                log.warning("insert failed (%s); retrying in %.2f s", _short(err), delay)
                with self._cond:
                    self._outage = True
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
                self._cond.notify_all()
            self.metrics.inserted.inc(len(priorities))

    def close(self, flush_seconds: float) -> None:
        """Gives the buffer up to flush_seconds to drain, then stops the thread."""
        deadline = time.monotonic() + flush_seconds
        with self._cond:
            self._cond.wait_for(lambda: not self._batches, max(0.0, deadline - time.monotonic()))
            self._closing = True
            self._cond.notify_all()
        self.replay.close()
        self._thread.join(5)


class ParameterPuller:
    """Fetches parameters in the background when asked; the actor loop picks them up."""

    def __init__(self, learner: LearnerClient, actor_id: str, metrics: ActorMetrics):
        self.learner, self.actor_id, self.metrics = learner, actor_id, metrics
        self.version, self.lineage = 0, 0
        self._wanted = threading.Event()
        self._wait_seconds = 0.0  # > 0: the next pull is a long poll for a newer version
        self.arrived = threading.Event()  # set while fresh parameters wait to be taken
        self._lock = threading.Lock()
        self._fresh: Parameters | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pull", daemon=True)
        self._thread.start()

    def request(self, wait_seconds: float = 0.0) -> None:
        """Asks for a pull; wait_seconds > 0 makes it a long poll (the learner answers when it
        publishes a version newer than the one held, or after that long)."""
        self._wait_seconds = wait_seconds
        self._wanted.set()

    def take(self) -> Parameters | None:
        with self._lock:
            fresh, self._fresh = self._fresh, None
            self.arrived.clear()
            return fresh

    def _run(self) -> None:
        backoff = Backoff()
        while not self._stop.is_set():
            if not self._wanted.wait(0.5):
                continue
            try:
                params = self.learner.get_parameters(
                    self.version, self.actor_id, self.lineage, self._wait_seconds
                )
            except Exception as err:  # learner away: act on the weights held, retry
                if self._stop.is_set():
                    return
                self.metrics.pull_failures.inc()
                log.warning("parameter pull failed (%s)", _short(err))
                self._stop.wait(backoff.next_delay())
                continue
            backoff.reset()
            self._wanted.clear()
            if self.version:  # an actor's first pull is not lag (it held no version)
                self.metrics.lag.set(params.version - self.version)
            if params.arrays:
                self.version, self.lineage = params.version, params.lineage
            with self._lock:
                self._fresh = params
                self.arrived.set()

    def close(self) -> None:
        self._stop.set()
        self.learner.close()
        self._thread.join(5)


def _short(err: Exception) -> str:
    details = getattr(err, "details", None)
    return details() if callable(details) else str(err)


def register_metrics(
    config: ActorConfig, registry: prometheus_client.CollectorRegistry
) -> ActorMetrics:
    """The actor's metrics, registered before the process says it is ready (its ready file):
    every scrape from the first on sees them."""
    return ActorMetrics(registry, algorithms.get(config.algorithm).exploration_name)


def run(
    config: ActorConfig,
    registry: prometheus_client.CollectorRegistry,
    stop: threading.Event,
    metrics: ActorMetrics | None = None,
) -> None:
    torch.set_num_threads(config.threads)
    metrics = metrics or register_metrics(config, registry)
    actor_id = uuid.uuid4().hex
    seed = (config.seed or int.from_bytes(uuid.uuid4().bytes[:4], "little")) + int(actor_id[:6], 16)
    rng = np.random.default_rng(seed)
    algorithm = algorithms.make(config)
    policy = algorithm.policy()
    columns_spec = algorithm.columns()
    envs, obs = make_vector_env(config.env, config.num_envs, seed % 2**31, EnvOptions.of(config))
    clip = algorithm.spec.clip_rewards
    lives = None  # Atari lives, for life_loss_terminal
    spec, unrolls = algorithm.spec, algorithm.unrolls
    adder = (
        UnrollAdder(config.num_envs, config.unroll_length, spec.obs_shape, spec.obs_dtype)
        if unrolls
        else NStepAdder(config.num_envs, config.n_step, config.gamma)
    )
    replay = connect(config.replay, timeout=30.0, retry_seconds=1.0, tls=config)
    buffer = InsertBuffer(replay, config.buffer_limit, metrics, stop)
    # Tries at most 0.1 s apart: an actor that starts before the learner serves (local mode
    # starts every process at once) slept up to 0.6 s past the moment it could have begun,
    # and ppo's first batch waits for every actor.
    learner = LearnerClient(config.learner, retry_seconds=1.0, retry_cap=0.1, tls=config)
    puller = ParameterPuller(learner, actor_id, metrics)
    log.info(
        "actor %s: %s x%d, waiting for parameters from %s",
        actor_id[:8],
        config.env,
        config.num_envs,
        config.learner,
    )

    exploration, version, have_weights = 0.0, 0, False
    acted, waiting = 0, 0.0  # ppo: the version of its last unroll; since when it waits
    pending: list[dict[str, np.ndarray]] = []
    pending_count = steps_since_pull = 0
    returns = np.zeros(config.num_envs)
    lengths = np.zeros(config.num_envs, np.int64)
    puller.request()
    try:
        while not stop.is_set():
            params = puller.take() if not unrolls or adder.at_boundary else None
            if params is not None:
                if params.algorithm != algorithm.name:  # acting on them would be nonsense
                    raise ValueError(
                        f"algorithm: this actor runs {algorithm.name}, the learner at"
                        f" {config.learner} runs {params.algorithm}"
                    )
                if params.arrays:
                    policy.load(params.arrays)
                    version, have_weights = params.version, True
                    metrics.version.set(version)
                exploration = params.exploration
                metrics.exploration.set(exploration)
                metrics.actor_index.set(params.actor_index)
            if not have_weights:  # nothing to act with yet: wait for the first pull
                stop.wait(0.05)
                continue
            if algorithm.current_version_only and adder.at_boundary and version <= acted:
                # ppo: this version has had its unroll; wait for the next, for a while (should
                # the learner lack unrolls of this version, e.g. an actor died, act again).
                waiting = waiting or time.monotonic()
                left = VERSION_WAIT_SECONDS - (time.monotonic() - waiting)
                if left > 0:
                    puller.request(wait_seconds=left)  # answered when the learner publishes
                    puller.arrived.wait(min(left, 0.05))  # 0.05: stays responsive to stop
                    continue
            waiting = 0.0

            if unrolls:
                actions, log_probs = policy.sample(obs, rng)
            else:
                actions = policy.act(obs, exploration, rng)
            next_obs, rewards, terminated, truncated, infos = envs.step(actions)
            done = terminated | truncated
            # What the learner learns from; the metrics below report the game's rewards.
            learned = np.clip(rewards, -1.0, 1.0) if clip else rewards
            ends = terminated
            if config.life_loss_terminal and "lives" in infos:
                # A life lost ends the n-step windows (discount 0), not the game: the env goes on.
                lost = lives is not None and (infos["lives"] < lives) & ~done
                ends = terminated | lost
                lives = infos["lives"]
            if unrolls:
                finals = final_observations(next_obs, infos) if truncated.any() else next_obs
                learned, discounts = step_targets(
                    learned, ends, truncated, finals, policy.values, config.gamma
                )
                columns = adder.add(obs, actions, log_probs, learned, discounts, next_obs, version)
                if columns is not None:
                    acted = version
                    # Fresh parameters for the next unroll; ppo's must be newer than these.
                    puller.request(VERSION_WAIT_SECONDS if algorithm.current_version_only else 0)
            else:
                columns = adder.add(
                    obs, actions, learned, ends, truncated, final_observations(next_obs, infos)
                )
            obs = next_obs

            returns += rewards
            lengths += 1
            for i in np.flatnonzero(done):
                metrics.episode_return.observe(returns[i])
                metrics.episode_length.observe(lengths[i])
            metrics.episodes.inc(int(done.sum()))
            returns[done], lengths[done] = 0.0, 0
            if not metrics.env_steps._value.get():
                metrics.first_step.set(time.time())
            metrics.env_steps.inc(config.num_envs)

            if columns is not None:
                pending.append(columns)
                pending_count += len(next(iter(columns.values())))
            if pending_count >= config.insert_batch or (unrolls and pending):
                batch = {k: np.concatenate([p[k] for p in pending]) for k in pending[0]}
                priorities = policy.priorities(batch) + config.priority_epsilon
                packed = pack(batch, columns_spec)
                for value in packed.values():
                    if isinstance(value, Packed):
                        metrics.frame_raw_bytes.inc(len(value) * value.item_nbytes)
                        metrics.frame_compressed_bytes.inc(int(value.sizes.sum()))
                buffer.put(packed, priorities)
                pending, pending_count = [], 0
            steps_since_pull += config.num_envs
            if not unrolls and steps_since_pull >= config.pull_interval:
                puller.request()
                steps_since_pull = 0
    finally:
        puller.close()
        buffer.close(flush_seconds=5.0)
        envs.close()
