"""REINFORCE: its returns and loss worked by hand, the whole-episode items its adder makes,
and the settings it refuses by name."""

import math

import numpy as np
import pytest
import torch

from apexrl import algorithms
from apexrl.algorithms.adders.episode import EpisodeAdder
from apexrl.algorithms.base import Step
from apexrl.algorithms.reinforce.builder import Settings
from apexrl.algorithms.reinforce.losses import (
    discounted_returns,
    masked_normalized,
    reinforce_loss,
)
from apexrl.config import AgentConfig, LearnerConfig

# --- returns -------------------------------------------------------------------------------


def returns_of(rewards, discounts, mask, bootstrap) -> np.ndarray:
    as_tensor = [torch.tensor(x, dtype=torch.float32) for x in (rewards, discounts, mask)]
    return discounted_returns(*as_tensor, torch.tensor(bootstrap, dtype=torch.float32)).numpy()


def test_a_terminated_episode_returns_its_discounted_rewards_and_nothing_after():
    """3 steps, the last terminal (discount 0): G_2 = 3, G_1 = 2 + 0.5 * 3, G_0 = 1 + 0.5 * 3.5;
    the bootstrap (10) is cut off by the terminal; the padding's returns are 0."""
    g = returns_of([[1, 2, 3, 0]], [[0.5, 0.5, 0.0, 0]], [[1, 1, 1, 0]], [10.0])
    np.testing.assert_allclose(g, [[2.75, 3.5, 3.0, 0.0]])


def test_a_truncated_episode_bootstraps_from_the_value_after_its_last_step():
    """The time limit keeps gamma on the last step: G_1 = 2 + 0.5 * V, V = 10; G_0 = 1 + 0.5 G_1.
    Without a baseline the bootstrap is 0: G_1 = 2, G_0 = 2."""
    g = returns_of([[1, 2, 0]], [[0.5, 0.5, 0]], [[1, 1, 0]], [10.0])
    np.testing.assert_allclose(g, [[1 + 0.5 * 7, 7.0, 0.0]])
    unbootstrapped = returns_of([[1, 2, 0]], [[0.5, 0.5, 0]], [[1, 1, 0]], [0.0])
    np.testing.assert_allclose(unbootstrapped, [[2.0, 2.0, 0.0]])


def test_items_of_a_batch_keep_their_own_returns():
    """A full item (no padding) truncated by a cut, and a one-step terminal one beside it."""
    rewards, discounts, mask = (
        [[1, 1, 1], [4, 0, 0]],
        [[1, 1, 1], [0, 0, 0]],
        [[1, 1, 1], [1, 0, 0]],
    )
    g = returns_of(rewards, discounts, mask, [2.0, 5.0])
    np.testing.assert_allclose(g, [[5.0, 4.0, 3.0], [4.0, 0.0, 0.0]])


def test_normalisation_is_over_the_real_steps_only():
    """Real steps 1, 2, 3: mean 2, std (n - 1) 1; the padding (100) is left out of both."""
    x = torch.tensor([[1.0, 2.0], [3.0, 100.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    out = masked_normalized(x, mask)
    np.testing.assert_allclose(out[mask > 0].numpy(), [-1.0, 0.0, 1.0], atol=1e-6)
    one = torch.tensor([[5.0, 7.0]])
    assert torch.equal(masked_normalized(one, torch.tensor([[1.0, 0.0]])), one)  # one step: as is


# --- loss ----------------------------------------------------------------------------------

# Two items of two steps, the second padded after one step; two actions.
LOGITS = torch.tensor([[[0.0, math.log(3)], [0.0, 0.0]], [[math.log(3), 0.0], [5.0, -5.0]]])
ACTIONS = torch.tensor([[1, 0], [1, 0]])
MASK = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
# pi(taken): 3/4, 1/2, 1/4
LOG_PI = [math.log(0.75), math.log(0.5), math.log(0.25)]
ENTROPY = [
    -(0.25 * math.log(0.25) + 0.75 * math.log(0.75)),
    math.log(2),
    -(0.25 * math.log(0.25) + 0.75 * math.log(0.75)),
]


def test_the_loss_without_a_baseline_weighs_each_log_probability_by_its_return():
    """Unnormalised: -(G . log pi(a)) / 3 real steps, minus the entropy cost times H."""
    returns = torch.tensor([[3.0, 2.0], [1.0, 0.0]])
    loss, figures = reinforce_loss(
        LOGITS, ACTIONS, returns, MASK, None, entropy_cost=0.1, normalize=False
    )
    policy = -(3 * LOG_PI[0] + 2 * LOG_PI[1] + 1 * LOG_PI[2]) / 3
    entropy = sum(ENTROPY) / 3
    assert float(figures["policy_loss"]) == pytest.approx(policy, rel=1e-6)
    assert float(figures["entropy"]) == pytest.approx(entropy, rel=1e-6)
    assert float(loss) == pytest.approx(policy - 0.1 * entropy, rel=1e-6)
    assert float(figures["value_loss"]) == 0.0 and float(figures["return_mean"]) == 2.0


def test_normalised_returns_are_the_advantages():
    """Returns 3, 2, 1 normalise to 1, 0, -1: the padding's return plays no part."""
    returns = torch.tensor([[3.0, 2.0], [1.0, 50.0]])
    loss, _ = reinforce_loss(LOGITS, ACTIONS, returns, MASK, None)
    assert float(loss) == pytest.approx(-(LOG_PI[0] - LOG_PI[2]) / 3, rel=1e-6)


def test_the_baseline_subtracts_v_from_the_advantage_and_learns_the_returns():
    """A = G - V = 1, 1, -2 unnormalised; value loss (G - V)^2 = 1, 1, 4 over 3 steps; the
    policy term's gradient reaches no value (V is detached there)."""
    returns = torch.tensor([[3.0, 2.0], [1.0, 0.0]])
    values = torch.tensor([[2.0, 1.0], [3.0, 9.0]], requires_grad=True)
    loss, figures = reinforce_loss(
        LOGITS, ACTIONS, returns, MASK, values, value_cost=0.5, normalize=False
    )
    policy = -(LOG_PI[0] + LOG_PI[1] - 2 * LOG_PI[2]) / 3
    assert float(figures["policy_loss"]) == pytest.approx(policy, rel=1e-6)
    assert float(figures["value_loss"]) == pytest.approx(6 / 3)
    assert float(loss.detach()) == pytest.approx(policy + 0.5 * 2, rel=1e-6)
    loss.backward()
    # d/dV of 0.5 * mean((G - V)^2) = -(G - V) / 3 on real steps, 0 on padding.
    np.testing.assert_allclose(values.grad.numpy(), [[-1 / 3, -1 / 3], [2 / 3, 0.0]], rtol=1e-6)


# --- the adder -----------------------------------------------------------------------------


def step(t: int, ends=(False,), truncated=(False,), version: int = 3) -> Step:
    """Step t of len(ends) envs: obs [t + 10 * env], action t % 2, reward t + 1; the final
    observation of an ended episode is -1."""
    n = len(ends)
    obs = (t + 10.0 * np.arange(n))[:, None]
    done = np.asarray(ends) | np.asarray(truncated)
    final = np.where(done[:, None], -1.0, obs + 1)
    rewards = np.full(n, t + 1.0)
    ends, truncated = np.asarray(ends), np.asarray(truncated)
    return Step(obs, np.full(n, t % 2), {}, rewards, ends, truncated, obs + 1, final, version)


def test_an_episode_is_one_item_padded_to_max_steps():
    adder = EpisodeAdder(2, 4, (1,), np.float32, gamma=0.9)
    assert adder.add(step(0, (False, False))) is None
    assert adder.add(step(1, (False, False))) is None
    item = adder.add(step(2, (True, False)))
    assert item["observations"].shape == (1, 5, 1)  # env 0's episode alone
    np.testing.assert_array_equal(item["observations"][0, :, 0], [0, 1, 2, -1, 0])
    np.testing.assert_array_equal(item["actions"][0], [0, 1, 0, 0])
    np.testing.assert_array_equal(item["rewards"][0], [1, 2, 3, 0])
    np.testing.assert_allclose(item["discounts"][0], [0.9, 0.9, 0.0, 0.0])
    np.testing.assert_array_equal(item["mask"][0], [1, 1, 1, 0])
    assert item["version"].tolist() == [3]
    dtypes = {k: str(v.dtype) for k, v in item.items()}
    assert dtypes == {
        "observations": "float32",
        "actions": "int64",
        "rewards": "float32",
        "discounts": "float32",
        "mask": "float32",
        "version": "int64",
    }


def test_a_truncated_episode_keeps_gamma_and_its_final_observation():
    adder = EpisodeAdder(2, 4, (1,), np.float32, gamma=0.9)
    adder.add(step(0, (False, False)))
    item = adder.add(step(1, (False, False), truncated=(False, True)))
    np.testing.assert_array_equal(item["observations"][0, :, 0], [10, 11, -1, 0, 0])
    np.testing.assert_allclose(item["discounts"][0], [0.9, 0.9, 0, 0])


def test_an_episode_longer_than_max_steps_is_cut_into_items_that_lose_no_step():
    """5 steps with max_steps 3: an item of steps 0-2 cut as a truncation (gamma kept, the
    observation after step 2 to bootstrap from), then steps 3-4 to the terminal, labelled with
    the version of its own first step."""
    adder = EpisodeAdder(1, 3, (1,), np.float32, gamma=0.9)
    items = [adder.add(step(t, (t == 4,), version=t)) for t in range(5)]
    assert [item is None for item in items] == [True, True, False, True, False]
    cut, tail = items[2], items[4]
    np.testing.assert_array_equal(cut["observations"][0, :, 0], [0, 1, 2, 3])
    np.testing.assert_array_equal(cut["rewards"][0], [1, 2, 3])
    np.testing.assert_allclose(cut["discounts"][0], [0.9, 0.9, 0.9])
    assert cut["mask"].tolist() == [[1, 1, 1]] and cut["version"].tolist() == [0]
    np.testing.assert_array_equal(tail["observations"][0, :, 0], [3, 4, -1, 0])
    np.testing.assert_array_equal(tail["rewards"][0], [4, 5, 0])
    np.testing.assert_allclose(tail["discounts"][0], [0.9, 0.0, 0.0])
    assert tail["mask"].tolist() == [[1, 1, 0]] and tail["version"].tolist() == [3]


def test_a_short_item_keeps_nothing_of_a_longer_one_before_it_in_its_padding():
    adder = EpisodeAdder(1, 4, (1,), np.float32, gamma=0.9)
    for t in range(3):
        adder.add(step(t + 5, (t == 2,)))
    item = adder.add(step(0, (True,)))
    assert item["observations"][0, :, 0].tolist() == [0, -1, 0, 0, 0]
    assert item["mask"].tolist() == [[1, 0, 0, 0]] and item["rewards"].tolist() == [[1, 0, 0, 0]]
    assert item["actions"].tolist() == [[0, 0, 0, 0]] and item["discounts"].tolist() == [[0] * 4]


# --- settings ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "env", "message"),
    [
        ({"baseline": "mean"}, "CartPole-v1", "baseline: must be one of none, value, got 'mean'"),
        ({"value_cost": -0.5}, "CartPole-v1", "value_cost: must be >= 0, got -0.5"),
        ({"entropy_cost": math.nan}, "CartPole-v1", "entropy_cost: must be >= 0, got nan"),
        ({"max_episode_steps": 0}, "CartPole-v1", "max_episode_steps: must be >= 1, got 0"),
        ({"capacity": 0}, "CartPole-v1", "capacity: must be >= 1, got 0"),
        ({"optimizer": "sgd"}, "CartPole-v1", "optimizer: must be one of adam, rmsprop"),
        ({}, "Pendulum-v1", "algorithm: reinforce acts in Discrete action spaces; Pendulum-v1"),
    ],
)
def test_settings_that_cannot_work_are_refused_by_name(settings, env, message):
    config = AgentConfig(algorithm="reinforce", env=env, algo=Settings(**settings))
    with pytest.raises(ValueError) as refused:
        algorithms.make(config)
    assert str(refused.value).startswith(message), str(refused.value)


def test_the_learner_trains_on_a_batch_of_episodes_as_the_replay_hands_them():
    """Items from the adder, through the learner's update: finite figures, the parameters move,
    and the mean item length is the batch's."""
    config = LearnerConfig(algorithm="reinforce", max_grad_norm=0.5)
    builder = algorithms.make(config)
    learning = builder.learning(config, torch.device("cpu"))
    (adder,) = builder.adders(2, builder.policy())
    rng = np.random.default_rng(0)
    items = []
    obs = rng.normal(size=(2, 4)).astype(np.float32)
    for t in range(12):
        ends = np.array([t in (4, 9), t == 11])
        actions, rewards = rng.integers(0, 2, 2), np.ones(2, np.float32)
        s = Step(obs, actions, {}, rewards, ends, np.zeros(2, bool), obs + 1, obs + 1, 1)
        items += [item] if (item := adder.add(s)) is not None else []
        obs = obs + 0.1
    batch = {k: torch.from_numpy(np.concatenate([i[k] for i in items])) for k in items[0]}
    before = learning.parameters()
    _, figures = learning.update(batch, torch.ones(3), 1)
    assert figures["episode_steps"] == pytest.approx((5 + 5 + 12) / 3)
    assert all(math.isfinite(v) for v in figures.values())
    after = learning.parameters()
    assert any(not np.array_equal(before[k], after[k]) for k in ("logits.weight", "value.weight"))


@pytest.mark.parametrize("baseline", ["value", "none"])
def test_the_learner_bootstraps_a_truncated_item_from_its_value_only_with_a_baseline(baseline):
    """One item truncated after one step (reward 1, discount 0.9): its return is
    1 + 0.9 V(the observation after it) with the value baseline, 1 without."""
    config = LearnerConfig(algorithm="reinforce", algo=Settings(baseline=baseline))
    builder = algorithms.make(config)
    learning = builder.learning(config, torch.device("cpu"))
    torch.nn.init.constant_(learning.net.value.bias, 2.0)  # V well away from 0
    obs = np.zeros((1, 501, 4), np.float32)
    obs[0, 1] = [0.1, -0.2, 0.3, 0.4]
    columns = builder.columns()
    batch = {c.name: torch.from_numpy(np.zeros((1, *c.shape), c.dtype)) for c in columns}
    batch["observations"] = torch.from_numpy(obs)
    batch["rewards"][0, 0], batch["discounts"][0, 0], batch["mask"][0, 0] = 1.0, 0.9, 1.0
    with torch.no_grad():
        value = float(learning.net.values(torch.from_numpy(obs[0, 1:2])))
    _, figures = learning.update(batch, torch.ones(1), 1)
    expected = 1 + 0.9 * value if baseline == "value" else 1.0
    assert figures["return_mean"] == pytest.approx(expected, rel=1e-6)
    assert figures["episode_steps"] == 1.0
