"""A3C through real servers: a learner on a real replay applies the gradients of the versions
it may and drops and counts the others; the replay, learner and two actor processes learn
CartPole-v1 from the actors' gradients, every gradient of both actors reaching the learner;
a setting that cannot be stops the learner at start-up, naming it."""

import threading
import time

import numpy as np
import prometheus_client
import torch

from apexrl import algorithms
from apexrl.algorithms.a3c.builder import Settings
from apexrl.common.learner_client import LearnerClient
from apexrl.common.parameters import ParameterStore
from apexrl.config import AgentConfig, LearnerConfig
from apexrl.learner.metrics import LearnerMetrics
from apexrl.learner.training import Learner
from apexrl.local.settings import replay_tables
from apexrl.replay.client import ReplayClient
from tests.conftest import metrics, wait_for
from tests.integration.queue_agents import config_file, learner_refusal, sampled_return

AGENT = AgentConfig(algorithm="a3c", env="CartPole-v1")
# The mean return of 10 episodes of the sampled policy (what A3C improves): near 22 for the
# untrained network's near-uniform one.
GOOD = 200.0


def gradient_items(builder, versions: list[int], seed: int) -> dict[str, np.ndarray]:
    """Gradients (random, small) of these versions, with their figures."""
    rng = np.random.default_rng(seed)
    items = {c.name: np.zeros((len(versions), *c.shape), c.dtype) for c in builder.columns()}
    items["gradient"] = rng.normal(0, 0.1, items["gradient"].shape).astype(np.float32)
    items["version"] = np.array(versions, np.int64)
    return items


def test_the_learner_applies_fresh_gradients_and_drops_and_counts_stale_ones(replay_factory):
    """max_staleness 1; the learner starts at version 1 and publishes after each gradient. Four
    gradients of version 1: the first applied at staleness 0 (version 2), the second at 1
    (version 3), the last two, 2 behind, dropped and counted, the parameters untouched by them;
    then one of version 3 applied."""
    config = LearnerConfig(algorithm="a3c", algo=Settings(max_staleness=1))
    server = replay_factory(tables=replay_tables(config, 1))
    config.replay = server.address
    builder = algorithms.make(config)
    registry = prometheus_client.CollectorRegistry()
    learner = Learner(
        config, builder, LearnerMetrics(registry, builder.metrics.figures), ParameterStore()
    )
    steps: list[dict[str, torch.Tensor]] = []
    update = learner.learning.update

    def recording(batch, weights, step):
        steps.append({k: v.clone() for k, v in batch.items()})
        return update(batch, weights, step)

    learner.learning.update = recording

    def sample(name: str) -> float:
        return registry.get_sample_value(f"apexrl_learner_{name}") or 0.0

    with ReplayClient(server.address, timeout=10) as replay:
        replay.insert(gradient_items(builder, [1, 1, 1, 1], seed=0))
        training = threading.Thread(target=learner.train, args=(replay,))
        training.start()
        wait_for(lambda: sample("stale_items_dropped_total") == 2, 20, "two stale gradients")
        assert sample("updates_total") == 2 and learner.store.version == 3
        assert sample("staleness") == 1.0
        replay.insert(gradient_items(builder, [3], seed=1))
        wait_for(lambda: sample("updates_total") == 3, 20, "a gradient of version 3")
        learner.stop.set()
        training.join(30)
    assert not training.is_alive()
    assert [s["staleness"].tolist() for s in steps] == [[0], [1], [0]]
    assert sample("stale_items_dropped_total") == 2 and sample("samples_consumed_total") == 3


def test_a3c_learns_cartpole_from_the_gradients_of_two_actors(service_process, tmp_path):
    config = config_file(tmp_path, AGENT)
    replay = service_process("replay", "--config", config)
    flags = ("--config", config, "--replay", replay.address)
    learner = service_process("learner", *flags, "--learning-rate", "2e-3")
    # Local mode's actors: 2 of 4 envs each.
    actor_flags = (*flags, "--learner", learner.address, "--num-envs", "4")
    actors = [service_process("actor", *actor_flags) for _ in range(2)]
    policy = algorithms.make(AGENT).policy()
    started = time.monotonic()
    with LearnerClient(learner.address) as client:
        untrained = sampled_return(policy, client.get_parameters(0).arrays, AGENT.env)
        score, version = untrained, 0
        while score < GOOD and time.monotonic() - started < 60:
            params = client.get_parameters(version, wait_seconds=1.0)
            if params.arrays:
                score, version = sampled_return(policy, params.arrays, AGENT.env), params.version
    seconds = time.monotonic() - started
    print(
        f"A3C: the sampled policy's mean return {score:.1f} at version {version},"
        f" {seconds:.1f} s after the actors served ({untrained:.1f} untrained)"
    )
    assert untrained < 50 and score >= GOOD

    # Every gradient either actor sent reaches the learner, which applies it (one an update)
    # or drops it as too stale: with the actors stopped, the learner drains the queue until
    # what it took equals what the replay took in. (An actor may start its envs late, torch's
    # import on a busy machine: both are waited for.)
    def sent_by_each() -> list[float] | None:
        sent = [metrics(a.metrics_port)["apexrl_actor_transitions_inserted_total"] for a in actors]
        return sent if min(sent) >= 20 else None

    sent = wait_for(sent_by_each, 30, "20 gradients from each actor")
    for actor in actors:
        actor.stop()

    def drained() -> dict[str, float] | None:
        learned = metrics(learner.metrics_port)
        taken = learned["apexrl_learner_samples_consumed_total"]
        taken += learned["apexrl_learner_stale_items_dropped_total"]
        inserted = metrics(replay.metrics_port)["apexrl_replay_inserts_total"]
        return learned if taken == inserted else None

    learned = wait_for(drained, 20, "the learner to take every gradient the actors sent")
    applied = learned["apexrl_learner_samples_consumed_total"]
    dropped = learned["apexrl_learner_stale_items_dropped_total"]
    print(f"A3C: gradients sent {sent}, applied {applied:.0f}, dropped as stale {dropped:.0f}")
    assert learned["apexrl_learner_updates_total"] == applied
    # Each actor's gradients were applied: all reached the learner, fewer were dropped.
    assert min(sent) > dropped
    assert 0 <= learned["apexrl_learner_staleness"] <= Settings().max_staleness
    for proc in (learner, replay):
        proc.stop()


def test_a_negative_max_staleness_stops_the_learner_at_start_up_naming_it(tmp_path):
    stderr = learner_refusal(tmp_path, AGENT, "--max-staleness", "-1")
    message = "apexrl learner: error: max_staleness: must be >= 0, got -1"
    assert message in stderr
