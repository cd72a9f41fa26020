"""The numpy policies (algorithms/numpy_policies.py) act as the torch networks the learner trains:
the same Q-values, actions, log-probabilities, values and initial priorities on the same
published weights; and an actor or evaluator of an MLP policy never imports torch."""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from apexrl import algorithms
from apexrl.algorithms.actor_critic import ActorCriticPolicy
from apexrl.algorithms.dqn.acting import DQNPolicy
from apexrl.algorithms.networks import state_to_numpy
from apexrl.algorithms.numpy_policies import MLPActorCriticPolicy, MLPQPolicy
from apexrl.config import ActorConfig

B = 256


def builder(algorithm: str, env: str = "CartPole-v1", **settings):
    config = ActorConfig(algorithm=algorithm, env=env, hidden="32,16,8")
    if settings:
        config.algo = algorithms.get(algorithm).Settings(**settings)
    return algorithms.make(config)


def random_weights(net: torch.nn.Module, seed: int) -> dict[str, np.ndarray]:
    """Weights far from the initial ones (orthogonal init makes the logits near-uniform)."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for parameter in net.parameters():
            parameter.normal_(0.0, 0.5)
    return state_to_numpy(net)


def observations(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 2, (B, 4)).astype(np.float32)


def test_mlp_q_policy_matches_the_dueling_network():
    b = builder("dqn")
    mine = b.policy()
    assert isinstance(mine, MLPQPolicy)
    net = b.network()
    weights = random_weights(net, 1)
    theirs = DQNPolicy(net)
    theirs.load(weights)
    mine.load(weights)
    obs = observations(2)
    with torch.no_grad():
        q = net(torch.from_numpy(obs)).numpy()
    np.testing.assert_allclose(mine.q(obs), q, rtol=1e-4, atol=1e-4)
    rng = np.random.default_rng(0)
    np.testing.assert_array_equal(mine.act(obs, 0.0, rng), theirs.act(obs, 0.0, rng))
    np.testing.assert_array_equal(
        mine.act(obs, 0.3, np.random.default_rng(5)), theirs.act(obs, 0.3, np.random.default_rng(5))
    )
    gen = np.random.default_rng(3)
    items = {
        "obs": obs,
        "action": gen.integers(0, 2, B).astype(np.int64),
        "reward": gen.normal(0, 1, B).astype(np.float32),
        "discount": (0.97 * (gen.random(B) < 0.9)).astype(np.float32),
        "next_obs": observations(4),
    }
    expected = theirs.priorities(items)
    assert expected.std() > 0.1  # the check compares real TD errors, not zeros
    np.testing.assert_allclose(mine.priorities(items), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("algorithm", ["ppo", "impala", "unreal"])
def test_mlp_actor_critic_policy_matches_the_network(algorithm):
    settings = {"pc_lambda": 0.0} if algorithm == "unreal" else {}
    b = builder(algorithm, **settings)
    mine = b.policy()
    assert isinstance(mine, MLPActorCriticPolicy)
    net = b.network()
    weights = random_weights(net, 7)  # unreal's: with its reward-prediction head
    theirs = ActorCriticPolicy(net)
    theirs.load(weights)
    mine.load(weights)
    obs = observations(8)
    with torch.no_grad():
        log_probs = torch.log_softmax(net.policy(torch.from_numpy(obs)), 1).numpy()
        values = net(torch.from_numpy(obs))[1].numpy()
    np.testing.assert_allclose(mine.log_probs(obs), log_probs, rtol=1e-4, atol=1e-4)
    assert log_probs.std() > 0.5  # far from uniform: a real comparison
    np.testing.assert_allclose(mine.values(obs), values, rtol=1e-4, atol=1e-4)
    rng = np.random.default_rng(0)
    np.testing.assert_array_equal(mine.act(obs, 0.0, rng), theirs.act(obs, 0.0, rng))
    mine_step = mine.step(obs, 1.0, np.random.default_rng(9))
    theirs_step = theirs.step(obs, 1.0, np.random.default_rng(9))
    np.testing.assert_array_equal(mine_step[0], theirs_step[0])
    np.testing.assert_allclose(
        mine_step[1]["log_probs"], theirs_step[1]["log_probs"], rtol=1e-4, atol=1e-4
    )


def test_torch_policies_remain_where_numpy_has_no_network():
    """Noisy and distributional heads act with torch."""
    assert isinstance(builder("dqn", noisy=True).policy(), DQNPolicy)
    assert isinstance(builder("dqn", distributional=True).policy(), DQNPolicy)


def test_a_weight_set_without_the_policys_names_is_refused():
    policy = builder("ppo").policy()
    weights = random_weights(builder("ppo").network(), 1)
    del weights["logits.bias"]
    with pytest.raises(ValueError, match=r"missing \['logits.bias'\]"):
        policy.load(weights)
    assert policy.arrays == {}


@pytest.mark.parametrize("algorithm", ["dqn", "ppo", "impala"])
def test_actor_and_evaluator_of_an_mlp_policy_import_no_torch(algorithm, tmp_path):
    """A process with the actor and evaluator modules builds the policy and adders, loads
    weights (from a file this process wrote with torch), acts, steps and computes priorities,
    and torch never enters its sys.modules."""
    b = builder(algorithm)
    np.savez(tmp_path / "weights.npz", **random_weights(b.network(), 3))
    code = f"""
import sys
import numpy as np
import apexrl.actor.loop, apexrl.evaluator.loop
from apexrl import algorithms
from apexrl.config import ActorConfig
b = algorithms.make(ActorConfig(algorithm={algorithm!r}, env="CartPole-v1", hidden="32,16,8"))
policy = b.policy()
(adder,) = b.adders(2, policy)
algorithms.set_torch_threads(1)
policy.load(dict(np.load({str(tmp_path / "weights.npz")!r})))
obs = np.zeros((2, 4), np.float32)
policy.act(obs, 0.0, np.random.default_rng(0))
policy.step(obs, 0.5, np.random.default_rng(0))
print(sorted(m for m in sys.modules if m.split(".")[0] == "torch"))
"""
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_a_service_process_runs_numpy_on_one_blas_thread():
    """OpenBLAS's workers spin between calls: with one per core, an actor acting in numpy kept
    1.25 cores busy. A process that imports apexrl.cli first (every service) has no worker
    thread besides its own."""
    code = "import os, apexrl.cli, numpy; print(len(os.listdir('/proc/self/task')))"
    environ = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=environ
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "1"
