"""Settings drawn per actor (draws.py) end to end: two actor processes given the same
distributions draw apart, report their draws on /metrics, and their transitions carry them:
the drawn n and gamma in the rewards and discounts, the drawn epsilon in the actions."""

import threading
import urllib.request

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from apexrl import algorithms
from apexrl.common.learner_client import LearnerClient
from apexrl.common.ports import free_port
from apexrl.config import ActorConfig
from tests.conftest import wait_for

DRAWN = ("--gamma", "{ uniform = [0.5, 0.95] }", "--n-step", "{ choice = [1, 2, 3, 4] }")
EXPLORATION = ("--exploration", "{ log_uniform = [0.01, 0.5] }")
SEEDS = ("1", "3")  # whose n_step draws differ (3 and 4)
SAMPLED = 2048


def greedy(learner: str, obs: np.ndarray) -> np.ndarray:
    """The greedy actions of the learner's newest version (the only one here) on `obs`."""
    with LearnerClient(learner, retry_seconds=5.0) as client:
        arrays = client.get_parameters().arrays
    policy = algorithms.make(ActorConfig(env="CartPole-v1")).policy()
    policy.load(arrays)
    return policy.act(obs, 0.0, np.random.default_rng(0))


def drawn_settings(port: int) -> dict[str, float]:
    """apexrl_actor_setting's samples on an actor's /metrics, by their `name` label, and its
    epsilon gauge."""
    url = f"http://127.0.0.1:{port}/metrics"
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "apexrl_actor_setting":
                found[sample.labels["name"]] = sample.value
            elif sample.name == "apexrl_actor_epsilon":
                found["epsilon gauge"] = sample.value
    return found


def test_two_actors_draw_apart_and_act_with_their_draws(service_process, replay_factory):
    # Each actor its own replay, to read its transitions; the learner's stays empty (it serves
    # its first version and leases, and trains on nothing).
    # The actors' sample uniformly: the share of exploring actions in a batch is the table's.
    replays = [replay_factory(capacity=10_000, sampler="uniform") for _ in range(2)]
    replays.append(replay_factory(capacity=10_000))
    port = free_port()  # the learner's, which the actors need as it starts
    actor = ("actor", "--learner", f"127.0.0.1:{port}", "--num-envs", "2", *DRAWN, *EXPLORATION)
    commands = [
        ("learner", "--port", str(port), "--replay", replays[2].address),
        (*actor, "--replay", replays[0].address, "--seed", SEEDS[0]),
        (*actor, "--replay", replays[1].address, "--seed", SEEDS[1]),
    ]
    started: list = [None] * len(commands)

    def start(i: int) -> None:  # all at once: each start is mostly imports
        started[i] = service_process(*commands[i])

    starts = [threading.Thread(target=start, args=(i,)) for i in range(len(commands))]
    for thread in starts:
        thread.start()
    for thread in starts:
        thread.join()
    learner, *actors = started
    drawn = []
    for actor, replay in zip(actors, replays[:2], strict=True):
        with replay.client() as client:
            wait_for(lambda c=client: c.info().size >= 1000, 30, "an actor's transitions")
            size, batch = client.info().size, client.sample(SAMPLED).columns
        seen = drawn_settings(actor.metrics_port)
        gamma, n, epsilon = seen["gamma"], seen["n_step"], seen["exploration"]
        assert 0.5 <= gamma <= 0.95 and n in (1, 2, 3, 4) and 0.01 <= epsilon <= 0.5
        assert seen["epsilon gauge"] == epsilon  # in place of its ladder place
        # CartPole pays 1 a step: a window that goes on (discount > 0) is n steps long, its
        # reward sum_{k<n} gamma^k and its discount gamma^n, the actor's own n and gamma.
        going = batch["discount"] > 0
        assert going.sum() > 100
        assert batch["discount"][going] == pytest.approx(gamma**n, rel=1e-5)
        assert batch["reward"][going] == pytest.approx((1 - gamma**n) / (1 - gamma), rel=1e-5)
        assert f"drawn n_step {int(n)}" in actor.log()
        # Its actions: epsilon-greedy on the learner's one version, so on CartPole's 2 actions
        # a share epsilon / 2 of them differ from the greedy one (4 standard deviations of the
        # table's share and of the sample's, drawn with replacement, at their largest).
        explored = np.mean(batch["action"] != greedy(f"127.0.0.1:{port}", batch["obs"]))
        bound = 4 * np.sqrt(0.25 * (1 / size + 1 / SAMPLED))
        assert abs(explored - epsilon / 2) <= bound, (explored, epsilon, bound)
        drawn.append((gamma, n, epsilon))
    assert len({d[1] for d in drawn}) == 2 and drawn[0][0] != drawn[1][0]
    for actor in actors:
        actor.stop()
    learner.stop()
    assert np.all(np.isfinite(np.array(drawn)))
