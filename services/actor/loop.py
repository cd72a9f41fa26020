"""The actor: the algorithm's behaviour policy on a local copy of its parameters, the items its
adders make, with initial priorities, to replay.

Stateless: every actor process is configured the same; its exploration parameter (whatever
the algorithm calls it) comes from the lease the learner hands out with parameters (see
protos/apexrl/v1/learner.proto). It never blocks on the network: parameters are pulled by a
background thread, and each adder's inserts go through a bounded buffer drained by another
thread that reconnects forever (the oldest items are dropped and counted when the buffer is
full): actor/outlets.py, one path for every adder.

    envs → policy.step (batched) → each outlet: adder → priorities → buffer → replay

When parameters change follows the algorithm (Builder.parameter_sync): every `pull_interval`
env steps, or after each item the adder completes (taken only where the adder allows, so an
item is one version's), optionally waiting for a version newer than the last item's.
"""

import logging
import math
import threading
import time
import uuid

import numpy as np
import prometheus_client

from apexrl import algorithms, draws
from apexrl.actor.outlets import InsertBuffer, Outlet
from apexrl.actor.parameters import ParameterPuller
from apexrl.algorithms.base import Step
from apexrl.algorithms.envs import (
    RETURN_BUCKETS,
    EnvOptions,
    final_observations,
    make_vector_env,
)
from apexrl.algorithms.rewards import RewardShaping
from apexrl.common.learner_client import LearnerClient, Parameters
from apexrl.config import ActorConfig
from apexrl.replay.sharded import connect
from apexrl.schedules import Schedule

log = logging.getLogger(__name__)

LENGTH_BUCKETS = (10, 25, 50, 100, 200, 500, 1000, 5000, 10000, 30000)
# At a stop, what is buffered gets this long to land. A replay that takes inserts answers in
# milliseconds; one whose rate limiter holds them (a learner sampling slower than the actor
# inserts) would hold the stop for as long as the learner takes: those batches are dropped.
STOP_FLUSH_SECONDS = 0.3


def exploration(
    setting: float, lease: float, env_steps: int, place: tuple[int, int] = (0, 1)
) -> float:
    """An actor's exploration parameter: its own `exploration` setting where it has one (a
    number (drawn at start or not), a schedule over its env steps or a ladder over its `place`
    (index, count of live actors), read at each parameter pull), else its place on the
    learner's ladder (`lease`)."""
    if isinstance(setting, Schedule):
        return setting.value(env_steps)
    if isinstance(setting, draws.Draw):  # the ladders stay: the rest was drawn at start
        return setting.at(*place)
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
        # The algorithm's exploration parameter under its own name (MetricNames.exploration):
        # a metric keeps one meaning whatever the algorithm.
        self.exploration = metric(G, exploration_name, exploration_help)
        self.setting = metric(
            G,
            "setting",
            "A setting this actor drew from its distribution at start (draws.py), by name.",
            labelnames=["name"],
        )
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


def relay_addresses(setting: str) -> list[str]:
    """The `parameters` setting's relay addresses, in order."""
    return [address.strip() for address in setting.split(",") if address.strip()]


def register_metrics(
    config: ActorConfig, registry: prometheus_client.CollectorRegistry
) -> ActorMetrics:
    """The actor's metrics, registered before the process says it is ready (its ready file):
    every scrape from the first on sees them."""
    builder = algorithms.get(config.algorithm)
    names = builder.metrics
    return ActorMetrics(registry, names.exploration, names.exploration_help)


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
    """One actor process's envs, policy, outlets (one per adder) and the parameter puller."""

    def __init__(self, config: ActorConfig, metrics: ActorMetrics, stop: threading.Event):
        # Each setting given a distribution drawn once, now (seeded by config.seed and its name).
        algorithms.get(config.algorithm).refuse_draws(config)
        config, drawn = draws.draw_settings(config)
        for name, value in drawn.items():
            metrics.setting.labels(name=name).set(value)
        self.config, self.metrics, self.stop = config, metrics, stop
        actor_id = uuid.uuid4().hex
        seed = config.seed or int.from_bytes(uuid.uuid4().bytes[:4], "little")
        seed += int(actor_id[:6], 16)
        self.rng = np.random.default_rng(seed)
        self.builder = builder = algorithms.make(config)
        self.sync = builder.parameter_sync
        self.policy = builder.policy()
        self.shaping = RewardShaping.of(config, builder.spec.clip_rewards)
        algorithms.set_torch_threads(config.threads)
        # Every adder has its outlet and fills its table from the same steps; the first one
        # paces the actor (its items are the ones parameter changes wait for).
        self.outlets = [
            self.outlet(adder) for adder in builder.adders(config.num_envs, self.policy)
        ]
        options = EnvOptions.of(config)
        self.envs, self.obs = make_vector_env(config.env, config.num_envs, seed % 2**31, options)
        self.policy.episode_starts(np.ones(config.num_envs, bool))
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
            "actor %s: %s x%d%s, waiting for parameters from %s",
            actor_id[:8],
            config.env,
            config.num_envs,
            "".join(f", drawn {name} {value:.6g}" for name, value in drawn.items()),
            ", ".join([*(r.address for r in relays), config.learner]),
        )
        self.exploration, self.version, self.have_weights = 0.0, 0, False
        self.acted, self.waiting = 0, 0.0  # the version of the last item; since when it waits
        self.steps_since_pull = self.steps = 0
        self.lives = None  # Atari lives, for life_loss_terminal
        self.returns = np.zeros(config.num_envs)
        self.lengths = np.zeros(config.num_envs, np.int64)

    def outlet(self, adder) -> Outlet:
        """The adder's way to its table: its own replay connection and insert buffer."""
        config, stop = self.config, self.stop
        replay = connect(
            config.replay, table=adder.table, timeout=30.0, retry_seconds=1.0, tls=config, stop=stop
        )
        buffer = InsertBuffer(replay, config.buffer_limit, self.metrics, stop)
        columns = self.builder.table_columns(adder.table)
        return Outlet(adder, columns, buffer, config.insert_batch, config.priority_epsilon)

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
        return all(outlet.adder.at_boundary for outlet in self.outlets)

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
        place = (params.actor_index, params.num_actors)
        self.exploration = exploration(
            self.config.exploration, params.exploration, self.steps, place
        )
        self.metrics.exploration.set(self.exploration)
        self.metrics.actor_index.set(params.actor_index)

    def step(self) -> None:
        config, obs = self.config, self.obs
        actions, extras = self.policy.step(obs, self.exploration, self.rng)
        next_obs, rewards, terminated, truncated, infos = self.envs.step(actions)
        done = terminated | truncated
        ends = terminated
        if config.life_loss_terminal and "lives" in infos:
            # A life lost ends the returns (discount 0), not the game: the env goes on.
            lost = self.lives is not None and (infos["lives"] < self.lives) & ~done
            ends = terminated | lost
            self.lives = infos["lives"]
        final_obs = final_observations(next_obs, infos) if done.any() else next_obs
        # What the learner learns from; the metrics report the env's rewards.
        learned = self.shaping(rewards, obs, final_obs, terminated, ends)
        step = Step(
            obs,
            actions,
            extras,
            learned,
            ends,
            truncated,
            next_obs,
            final_obs,
            self.version,
        )
        completed = [outlet.add(step) for outlet in self.outlets]
        self.obs = next_obs
        if done.any():  # SAME_STEP autoreset: next_obs begins their new episodes
            self.policy.episode_starts(done)
        self.count(rewards, done)
        if completed[0] and not self.sync.periodic:  # new parameters for the next item
            self.acted = self.version
            self.puller.request(self.sync.wait_seconds if self.sync.newer_each_item else 0)
        for outlet in self.outlets:
            outlet.flush_if_due(self.policy, self.metrics)
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

    def close(self) -> None:
        self.puller.close()
        for outlet in self.outlets:
            outlet.buffer.close(flush_seconds=STOP_FLUSH_SECONDS)
        self.envs.close()
