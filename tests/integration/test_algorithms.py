"""One setting drives the stack: Ape-X DPG through the same replay, learner and actor processes,
and the mistakes a mixed configuration makes are refused with a message saying what is wrong."""

import subprocess
import sys

import grpc
import numpy as np
import pytest

from apexrl import algorithms
from apexrl.algorithms.exploration import noise_ladder
from apexrl.common.learner_client import LearnerClient
from apexrl.config import AgentConfig
from apexrl.local.settings import signature as table_signature
from apexrl.replay.client import ReplayClient
from tests.conftest import metric, wait_for

DPG = ("--algorithm", "dpg", "--env", "Pendulum-v1")


def test_dpg_actors_and_learner_train_through_the_same_services(service_process):
    signature = table_signature(AgentConfig(algorithm="dpg", env="Pendulum-v1"))
    replay = service_process("replay", "--min-size-to-sample", "200", "--signature", signature)
    learner = service_process("learner", *DPG, "--replay", replay.address, "--batch-size", "64",
                              "--lease-seconds", "2")  # fmt: skip
    with LearnerClient(learner.address) as client:
        untrained = client.get_parameters(0)  # published before any transition arrived
    assert untrained.update_step == 0
    actors = [
        service_process(
            "actor",
            *DPG,
            "--replay",
            replay.address,
            "--learner",
            learner.address,
            "--num-envs",
            "2",
            "--insert-batch",
            "16",
            "--pull-interval",
            "50",
        )  # fmt: skip
        for _ in range(2)
    ]
    # Both actors act and insert; the learner trains on what they sent and publishes versions:
    # its actor has learned to climb its critic on the states the actors sent.
    wait_for(lambda: metric(learner.metrics_port, "apexrl_learner_updates_total") >= 400, 180,
             "DPG updates")  # fmt: skip
    with ReplayClient(replay.address) as client:
        batch = client.sample(32)
        fixed = client.sample(256).columns
    with LearnerClient(learner.address) as client:
        trained = client.get_parameters(0)
    policy = algorithms.make(AgentConfig(algorithm="dpg", env="Pendulum-v1")).policy()
    before = policy_climbs(policy, untrained.arrays, trained.arrays, fixed)
    after = policy_climbs(policy, trained.arrays, trained.arrays, fixed)
    share, margin = actor_beats(policy, trained.arrays, untrained.arrays, trained.arrays, fixed)
    print(f"DPG: pi(s) above the action taken in Q's eyes in {after:.0%} of 256 sampled states"
          f" at update {trained.update_step}, {before:.0%} untrained; above the untrained"
          f" actor's in {share:.0%} (mean Q {margin:+.2f})")  # fmt: skip
    # A few hundred updates in, the critic still moves and the shares spread from run to run,
    # but the trained actor beats the untrained one in its critic's eyes.
    assert after > before and share > 0.6 and margin > 0
    action = batch.columns["action"]
    assert action.dtype == np.float32 and action.shape == (32, 1)
    assert np.all(np.abs(action) <= 2.0) and np.unique(action).size > 1  # bounded, explored
    assert batch.columns["obs"].shape == (32, 3)
    # Each actor holds a version > 1 and a place in the noise ladder over the two live actors.
    ladder = pytest.approx([noise_ladder(1, 2), noise_ladder(0, 2)])
    wait_for(  # an actor that came first held the lone scale until its next pull
        lambda: (
            sorted(metric(a.metrics_port, "apexrl_actor_noise_scale") for a in actors) == ladder
        ),
        60,
        "the noise ladder over two actors",
    )
    assert metric(actors[0].metrics_port, "apexrl_actor_epsilon") == 0.0  # not exported
    wait_for(
        lambda: all(metric(a.metrics_port, "apexrl_actor_parameter_version") > 1 for a in actors),
        60,
        "fresh parameters at every actor",
    )
    with LearnerClient(learner.address) as client:
        params = client.get_parameters(0, "probe")
    assert params.algorithm == "dpg" and params.exploration == pytest.approx(noise_ladder(2, 3))
    # One actor leaves: within a lease the ladder re-spreads over the one left (lone scale).
    actors[1].stop()
    wait_for(
        lambda: (
            metric(actors[0].metrics_port, "apexrl_actor_noise_scale")
            == pytest.approx(noise_ladder(0, 1))
        ),
        30,
        "the ladder re-spread over one actor",
    )
    for proc in (actors[0], learner, replay):
        proc.stop()


def policy_climbs(policy, actor: dict, critic: dict, columns: dict) -> float:
    """The share of sampled states where the policy of `actor` picks an action that the critic
    of `critic` values above the action taken there (DPG's actor climbs its critic: a trained
    one nearly everywhere, an untrained one about as often as not)."""
    import torch

    policy.load(critic)
    obs = torch.from_numpy(columns["obs"])
    with torch.no_grad():
        taken = policy.nets.critic(obs, torch.from_numpy(columns["action"]))
        policy.load(actor)
        chosen = policy.nets.policy(obs)
        policy.load(critic)
        mine = policy.nets.critic(obs, chosen)
    return float((mine > taken).float().mean())


def actor_beats(policy, actor: dict, other: dict, critic: dict, columns: dict):
    """(share of states, mean Q margin) where the critic of `critic` values the action of
    `actor`'s policy above that of `other`'s."""
    import torch

    obs = torch.from_numpy(columns["obs"])
    with torch.no_grad():
        policy.load(other)
        theirs = policy.nets.policy(obs)
        policy.load(actor)
        mine = policy.nets.policy(obs)
        policy.load(critic)
        q_mine, q_theirs = policy.nets.critic(obs, mine), policy.nets.critic(obs, theirs)
    return float((q_mine > q_theirs).float().mean()), float((q_mine - q_theirs).mean())


def assert_refused(client: ReplayClient, base: dict, cases: list) -> None:
    """Each (action, message): an insert of base with that action is INVALID_ARGUMENT, its
    message starting with `message`."""
    for action, message in cases:
        with pytest.raises(grpc.RpcError) as caught:
            client.insert(base | {"action": action})
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert caught.value.details().startswith(message), caught.value.details()


def test_replay_refuses_actions_of_the_wrong_dtype_or_out_of_bounds(service_process):
    signature = table_signature(AgentConfig(algorithm="dpg", env="Pendulum-v1"))
    replay = service_process("replay", "--signature", signature)
    obs = np.zeros((4, 3), np.float32)
    base = {"obs": obs, "reward": np.zeros(4, np.float32), "discount": np.ones(4, np.float32),
            "next_obs": obs}  # fmt: skip
    with ReplayClient(replay.address) as client:
        assert_refused(client, base, [
            (np.zeros(4, np.int64), 'batch.columns["action"]: dtype must be float32'),
            (np.zeros((4, 1), np.int64), 'batch.columns["action"]: dtype must be float32'),
            (np.full((4, 1), 3.0, np.float32), 'batch.columns["action"]: values must lie in'),
        ])  # fmt: skip
        assert client.info().size == 0
    replay.stop()


def test_replay_bounds_every_dimension_of_lunar_lander_actions(service_process):
    signature = table_signature(AgentConfig(algorithm="dpg", env="LunarLanderContinuous-v3"))
    replay = service_process("replay", "--signature", signature)
    obs = np.zeros((2, 8), np.float32)
    base = {"obs": obs, "reward": np.zeros(2, np.float32), "discount": np.ones(2, np.float32),
            "next_obs": obs}  # fmt: skip
    with ReplayClient(replay.address) as client:
        client.insert(base | {"action": np.array([[-1.0, 1.0], [0.5, -0.25]], np.float32)})
        assert_refused(client, base, [
            (np.zeros((2, 1), np.float32), 'batch.columns["action"]: '),  # one engine, not two
            (np.array([[0.0, 0.0], [0.0, 1.5]], np.float32), 'batch.columns["action"]: values'),
        ])  # fmt: skip
        assert client.info().size == 2
    replay.stop()


def test_a_learner_refuses_another_algorithms_checkpoint(service_process, filled_replay, tmp_path):
    ckpt = tmp_path / "learner"
    dqn = service_process("learner", "--replay", filled_replay.address,
                          "--checkpoint-dir", str(ckpt))  # fmt: skip
    dqn.stop()  # writes its final checkpoint
    started = subprocess.run(
        [sys.executable, "-m", "apexrl.cli", "learner", *DPG, "--replay", filled_replay.address,
         "--checkpoint-dir", str(ckpt), "--port", "0", "--metrics-port", "0"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert started.returncode == 2, started.stderr
    assert "holds a dqn learner's state, this learner runs algorithm dpg" in started.stderr


def test_an_actor_refuses_a_learner_of_another_algorithm(service_process, filled_replay):
    learner = service_process("learner", "--replay", filled_replay.address)  # dqn, CartPole
    actor = subprocess.run(
        [sys.executable, "-m", "apexrl.cli", "actor", *DPG, "--replay", filled_replay.address,
         "--learner", learner.address, "--metrics-port", "0"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert actor.returncode == 2, actor.stderr
    assert "this actor runs dpg, the learner at" in actor.stderr and "runs dqn" in actor.stderr
    learner.stop()
