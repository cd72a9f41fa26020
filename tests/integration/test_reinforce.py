"""REINFORCE through the real replay, learner and actor processes: whole episodes go through a
queue table and the learner's policy comes to balance the pole; a setting that cannot
be stops a service at start-up, naming it."""

import time

from apexrl import algorithms
from apexrl.common.learner_client import LearnerClient
from apexrl.config import AgentConfig
from tests.conftest import metrics
from tests.integration.queue_agents import config_file, learner_refusal, sampled_return

AGENT = AgentConfig(algorithm="reinforce", env="CartPole-v1")
# The mean return of 10 episodes of the sampled policy (what REINFORCE improves): near 22 for
# the untrained network's near-uniform one. Its greedy policy is no measure of training: an
# untrained network's argmax, a linear-looking policy of the state, scored 340 once.
GOOD = 200.0


def test_reinforce_learns_cartpole_from_whole_episodes(service_process, tmp_path):
    config = config_file(tmp_path, AGENT)
    replay = service_process("replay", "--config", config)
    flags = ("--config", config, "--replay", replay.address)
    learner = service_process("learner", *flags, "--batch-size", "16", "--learning-rate", "2e-3")
    # Local mode's actors: 2 of 4 envs each.
    actor_flags = (*flags, "--learner", learner.address, "--num-envs", "4")
    actors = [service_process("actor", *actor_flags) for _ in range(2)]
    policy = algorithms.make(AGENT).policy()
    started = time.monotonic()
    with LearnerClient(learner.address) as client:
        untrained = sampled_return(policy, client.get_parameters(0).arrays, AGENT.env)
        score, version = untrained, 0
        while score < GOOD and time.monotonic() - started < 120:
            time.sleep(1.0)
            params = client.get_parameters(0)
            score, version = sampled_return(policy, params.arrays, AGENT.env), params.version
    seconds = time.monotonic() - started
    print(
        f"REINFORCE: the sampled policy's mean return {score:.1f} at version {version},"
        f" {seconds:.1f} s after the actors served ({untrained:.1f} untrained)"
    )
    assert untrained < 50 and score >= GOOD
    # Each version is one update on 16 whole episodes of that version; those an actor was
    # still playing when a newer one came were dropped and counted, never trained on.
    # One scrape, the learner training on: an update counts itself before its items.
    learned = metrics(learner.metrics_port)
    updates = learned["apexrl_learner_updates_total"]
    assert learned["apexrl_learner_samples_consumed_total"] in (16 * updates, 16 * (updates - 1))
    assert 1 < learned["apexrl_learner_episode_steps"] <= 500
    assert learned["apexrl_learner_stale_items_dropped_total"] > 0
    for proc in (*actors, learner, replay):
        proc.stop()


def test_a_baseline_that_cannot_be_stops_the_learner_at_start_up_naming_it(tmp_path):
    stderr = learner_refusal(tmp_path, AGENT, "--baseline", "mean")
    message = "apexrl learner: error: baseline: must be one of none, value, got 'mean'"
    assert message in stderr
