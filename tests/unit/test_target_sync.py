"""Target networks: soft (Polyak) and hard syncs by hand, target_tau reaching dqn's, r2d2's and
dpg's learning, dpg's own policy learning rate, and bad settings refused by name."""

import copy
import math

import pytest
import torch
from torch import nn

from apexrl import algorithms
from apexrl.algorithms.networks import sync_target
from apexrl.config import LearnerConfig


def small_net(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    net.train()(torch.randn(8, 3))  # moves the batch-norm statistics off their start
    return net


def test_a_soft_sync_blends_each_parameter_and_copies_the_buffers():
    online, target = small_net(0), small_net(1)
    before = copy.deepcopy(target)
    sync_target(target, online, 0.25)
    for mine, old, theirs in zip(
        target.parameters(), before.parameters(), online.parameters(), strict=True
    ):
        torch.testing.assert_close(mine, 0.75 * old + 0.25 * theirs)
    for mine, theirs in zip(target.buffers(), online.buffers(), strict=True):
        torch.testing.assert_close(mine, theirs)


def test_tau_one_is_a_hard_copy():
    online, target = small_net(0), small_net(1)
    sync_target(target, online, 1.0)
    for name, value in online.state_dict().items():
        torch.testing.assert_close(target.state_dict()[name], value)


def make(algorithm: str, env: str, **settings):
    config = LearnerConfig(
        algorithm=algorithm,
        env=env,
        algo=algorithms.get(algorithm).Settings(**settings),
        learning_rate=1e-2,
        hidden="16",
    )
    return algorithms.make(config), config


def dqn_batch(size: int = 16) -> dict:
    g = torch.Generator().manual_seed(3)
    return {
        "obs": torch.randn(size, 4, generator=g),
        "action": torch.randint(0, 2, (size,), generator=g),
        "reward": torch.randn(size, generator=g),
        "discount": torch.full((size,), 0.9),
        "next_obs": torch.randn(size, 4, generator=g),
    }


def dpg_batch(size: int = 16) -> dict:
    g = torch.Generator().manual_seed(3)
    return {
        "obs": torch.randn(size, 3, generator=g),
        "action": torch.rand(size, 1, generator=g) * 4 - 2,
        "reward": torch.randn(size, generator=g),
        "discount": torch.full((size,), 0.9),
        "next_obs": torch.randn(size, 3, generator=g),
    }


@pytest.mark.parametrize(
    ("algorithm", "env", "batch"),
    [("dqn", "CartPole-v1", dqn_batch), ("dpg", "Pendulum-v1", dpg_batch)],
)
def test_target_tau_blends_the_online_network_in_at_each_sync(algorithm, env, batch):
    """target_update_interval 2, target_tau 0.1: the target stands still after update 1 and is
    0.9 of itself plus 0.1 of the online network after update 2."""
    torch.manual_seed(0)
    builder, config = make(algorithm, env, target_tau=0.1, target_update_interval=2)
    learning = builder.learning(config, torch.device("cpu"))
    start = copy.deepcopy(learning.target.state_dict())
    learning.update(batch(), torch.ones(16), 1)
    for name, value in learning.target.state_dict().items():
        torch.testing.assert_close(value, start[name])
    learning.update(batch(), torch.ones(16), 2)
    online = learning.online.state_dict()
    changed = 0
    for name, value in learning.target.state_dict().items():
        if value.is_floating_point():
            torch.testing.assert_close(value, 0.9 * start[name] + 0.1 * online[name])
            changed += not torch.equal(value, start[name])
    assert changed > 0


def test_dpg_policy_learning_rate_is_its_own_or_the_learners():
    builder, config = make("dpg", "Pendulum-v1", policy_learning_rate=1e-4)
    learning = builder.learning(config, torch.device("cpu"))
    assert [g["lr"] for g in learning.policy_optimizer.param_groups] == [1e-4]
    assert [g["lr"] for g in learning.critic_optimizer.param_groups] == [1e-2]
    builder, config = make("dpg", "Pendulum-v1")
    learning = builder.learning(config, torch.device("cpu"))
    assert [g["lr"] for g in learning.policy_optimizer.param_groups] == [1e-2]


@pytest.mark.parametrize(
    ("algorithm", "env"), [("dqn", "CartPole-v1"), ("dpg", "Pendulum-v1"), ("r2d2", "CartPole-v1")]
)
@pytest.mark.parametrize("tau", [0.0, -0.1, 1.5, math.nan])
def test_a_target_tau_outside_zero_to_one_is_refused_by_name(algorithm, env, tau):
    with pytest.raises(ValueError, match=r"target_tau: must be in \(0, 1\]"):
        make(algorithm, env, target_tau=tau)


@pytest.mark.parametrize("rate", [-1e-3, math.nan])
def test_a_negative_policy_learning_rate_is_refused_by_name(rate):
    with pytest.raises(ValueError, match="policy_learning_rate: must be >= 0"):
        make("dpg", "Pendulum-v1", policy_learning_rate=rate)
