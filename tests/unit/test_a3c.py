"""A3C: its n-step returns worked by hand; the gradient an actor sends is the gradient of the
loss on its unroll, and the learner applies exactly it (both checked against the loss written
out here, step by step, and torch autograd); gradients too stale are dropped and counted;
the gradient column's length counted without torch; the settings it refuses by name."""

import math

import numpy as np
import pytest
import torch

from apexrl import algorithms
from apexrl.algorithms.a3c.builder import Settings, gradient_size
from apexrl.algorithms.a3c.learning import FreshGradients
from apexrl.algorithms.a3c.losses import a3c_loss, nstep_returns
from apexrl.algorithms.actor_critic import ActorCriticNetwork
from apexrl.algorithms.base import Step, hidden_sizes
from apexrl.algorithms.envs import EnvSpec, env_spec
from apexrl.algorithms.networks import state_to_numpy
from apexrl.config import ActorConfig, AgentConfig, LearnerConfig

# --- returns and loss ----------------------------------------------------------------------


def test_nstep_returns_run_from_the_bootstrap_and_stop_at_a_zero_discount():
    """Env 0: R_2 = 3 + 0.5 * 10, R_1 = 2 + 0.5 R_2, R_0 = 1 + 0.5 R_1; env 1 ends at step 1
    (discount 0): the bootstrap (10) never reaches R_1 or R_0."""
    rewards = torch.tensor([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]])
    discounts = torch.tensor([[0.5, 0.5], [0.5, 0.0], [0.5, 0.5]])
    returns = nstep_returns(rewards, discounts, torch.tensor([10.0, 10.0]))
    np.testing.assert_allclose(returns.numpy(), [[4.0, 2.0], [6.0, 2.0], [8.0, 8.0]])


def test_the_loss_weighs_log_pi_by_the_detached_advantage_and_regresses_v_on_the_returns():
    """One step of one env, two actions, pi(taken) = 3/4; R = 1 + 0.5 * 4 = 3, V = 1: policy
    -log(3/4) * 2, value 1/2 (3 - 1)^2 = 2, entropy of (1/4, 3/4)."""
    logits = torch.tensor([[[0.0, math.log(3)]]], requires_grad=True)
    values = torch.tensor([[1.0]], requires_grad=True)
    loss, figures = a3c_loss(
        logits,
        values,
        torch.tensor([4.0]),
        torch.tensor([[1]]),
        torch.tensor([[1.0]]),
        torch.tensor([[0.5]]),
        value_cost=0.5,
        entropy_cost=0.1,
    )
    entropy = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert float(figures["policy_loss"]) == pytest.approx(-math.log(0.75) * 2, rel=1e-6)
    assert float(figures["value_loss"]) == pytest.approx(2.0, rel=1e-6)
    assert float(figures["entropy"]) == pytest.approx(entropy, rel=1e-6)
    expected = -math.log(0.75) * 2 + 0.5 * 2.0 - 0.1 * entropy
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-6)
    loss.backward()
    # d/dV: the value term alone, 0.5 * -(R - V) = -1 (the advantage is detached).
    assert float(values.grad) == pytest.approx(-1.0, rel=1e-6)


# --- the gradient an actor sends and the learner applies ----------------------------------

GAMMA, VALUE_COST, ENTROPY_COST, LENGTH = 0.9, 0.5, 0.01, 4


def unroll_steps(policy, spec: EnvSpec, seed: int) -> list[Step]:
    """LENGTH steps of 2 envs acted by the policy on random observations: env 0 terminates at
    step 1, env 1 is truncated at step 2 (its final observation differs from the next one)."""
    rng = np.random.default_rng(seed)
    steps, obs = [], rng.normal(size=(2, *spec.obs_shape)).astype(np.float32)
    for t in range(LENGTH):
        actions, extras = policy.step(obs, 1.0, rng)
        next_obs = rng.normal(size=obs.shape).astype(np.float32)
        ends, truncated = np.array([t == 1, False]), np.array([False, t == 2])
        final = np.where((ends | truncated)[:, None], next_obs + 5, next_obs).astype(np.float32)
        rewards = rng.normal(size=2).astype(np.float32)
        steps.append(Step(obs, actions, extras, rewards, ends, truncated, next_obs, final, 7))
        obs = next_obs
    return steps


def loss_written_out(net: ActorCriticNetwork, steps: list[Step], discrete: bool) -> torch.Tensor:
    """The A3C loss of the unroll, one env and one step at a time: R from V(observation after
    the unroll) backwards, a terminal's R its reward, a truncation's its reward plus gamma
    V(final observation); mean over the steps of -log pi(a) (R - V) + value_cost 1/2 (R - V)^2
    - entropy_cost H."""
    terms = []
    for env in range(2):

        def value(obs, env=env):
            return net(torch.from_numpy(obs[env : env + 1]))[1][0]

        following = value(steps[-1].next_obs).detach()
        for step in reversed(steps):
            if step.ends[env]:
                following = torch.tensor(float(step.rewards[env]))
            elif step.truncated[env]:
                following = step.rewards[env] + GAMMA * value(step.final_obs).detach()
            else:
                following = step.rewards[env] + GAMMA * following
            out, v = net(torch.from_numpy(step.obs[env : env + 1]))
            if discrete:
                pi = torch.distributions.Categorical(logits=out[0])
                log_pi = pi.log_prob(torch.tensor(step.actions[env]))
            else:
                mean, log_std = out[0].chunk(2)
                pi = torch.distributions.Normal(mean, log_std.exp())
                log_pi = pi.log_prob(torch.from_numpy(step.extras["sampled_actions"][env])).sum()
            advantage = (following - v[0]).detach()
            entropy = pi.entropy().sum()
            terms.append(
                -log_pi * advantage
                + VALUE_COST * 0.5 * (following - v[0]) ** 2
                - ENTROPY_COST * entropy
            )
    return torch.stack(terms).mean()


def randomized(net: ActorCriticNetwork, seed: int) -> ActorCriticNetwork:
    """Weights far from the initial ones (orthogonal init makes the policy near-uniform)."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for parameter in net.parameters():
            parameter.normal_(0.0, 0.3)
    return net


@pytest.mark.parametrize("env", ["CartPole-v1", "Pendulum-v1"])
@pytest.mark.parametrize("max_grad_norm", [1e9, 0.5])
def test_the_gradient_applied_is_the_gradient_of_the_loss_on_its_unroll(env, max_grad_norm):
    """The actor's item holds d loss / d theta of its unroll at the weights it acted with (the
    loss written out above, through torch autograd; the policy acts in numpy, the adder's
    network takes its weights); the learner, holding the same weights,
    takes one RMSProp step on exactly that gradient (clipped to max_grad_norm), worked out
    here: square_avg = (1 - 0.99) g^2, theta -= lr g / (sqrt(square_avg) + eps)."""
    settings = Settings(unroll_length=LENGTH, value_cost=VALUE_COST, entropy_cost=ENTROPY_COST)
    actor = ActorConfig(algorithm="a3c", env=env, hidden="16,8", gamma=GAMMA, algo=settings)
    builder = algorithms.make(actor)
    policy, net = builder.policy(), randomized(builder.network(), 3)
    (adder,) = builder.adders(2, policy)
    policy.load(state_to_numpy(net))
    items = [adder.add(step) for step in unroll_steps(policy, builder.spec, 4)]
    assert [item is None for item in items] == [True] * (LENGTH - 1) + [False]
    item = items[-1]
    assert item["version"].tolist() == [7] and item["gradient"].dtype == np.float32

    loss = loss_written_out(net, unroll_steps(policy, builder.spec, 4), builder.spec.discrete)
    expected = torch.autograd.grad(loss, list(net.parameters()))
    flat = torch.cat([g.reshape(-1) for g in expected]).numpy()
    assert np.abs(flat).max() > 1e-3  # a real comparison, not of zeros
    np.testing.assert_allclose(item["gradient"][0], flat, rtol=1e-4, atol=1e-6)
    loss = float(loss.detach())
    assert float(item["loss"][0]) == pytest.approx(loss, rel=1e-5)

    lr, eps = 0.01, settings.optimizer_eps
    config = LearnerConfig(
        algorithm="a3c",
        env=env,
        hidden="16,8",
        learning_rate=lr,
        max_grad_norm=max_grad_norm,
        algo=settings,
    )
    learning = algorithms.make(config).learning(config, torch.device("cpu"))
    learning.net.load_state_dict(net.state_dict())
    batch = {k: torch.from_numpy(v) for k, v in item.items()} | {"staleness": torch.tensor([2])}
    _, figures = learning.update(batch, torch.ones(1), 1)
    norm = float(np.linalg.norm(flat.astype(np.float64)))
    assert figures["gradient_norm"] == pytest.approx(norm, rel=1e-4)
    assert figures["staleness"] == 2 and figures["loss"] == pytest.approx(loss, rel=1e-5)
    scale = min(1.0, max_grad_norm / (norm + 1e-6))
    for (name, before), g in zip(net.named_parameters(), expected, strict=True):
        g = g * scale
        step = lr * g / ((0.01 * g**2).sqrt() + eps)
        after = dict(learning.net.named_parameters())[name]
        torch.testing.assert_close(after, before - step, rtol=1e-4, atol=1e-6, msg=name)


def test_each_unrolls_gradient_is_at_the_weights_that_acted_it():
    """The actor loads new weights between two unrolls: the second gradient is the loss's at
    them, not at the first ones."""
    settings = Settings(unroll_length=LENGTH, value_cost=VALUE_COST, entropy_cost=ENTROPY_COST)
    actor = ActorConfig(algorithm="a3c", hidden="16,8", gamma=GAMMA, algo=settings)
    builder = algorithms.make(actor)
    policy = builder.policy()
    (adder,) = builder.adders(2, policy)
    for seed in (3, 5):
        net = randomized(builder.network(), seed)
        policy.load(state_to_numpy(net))
        *_, item = [adder.add(step) for step in unroll_steps(policy, builder.spec, seed)]
        loss = loss_written_out(net, unroll_steps(policy, builder.spec, seed), discrete=True)
        expected = torch.autograd.grad(loss, list(net.parameters()))
        flat = torch.cat([g.reshape(-1) for g in expected]).numpy()
        np.testing.assert_allclose(item["gradient"][0], flat, rtol=1e-4, atol=1e-6)


# --- staleness -----------------------------------------------------------------------------


def gradients(versions: list[int]) -> tuple[dict, torch.Tensor, np.ndarray]:
    """A sampled batch of gradients of these versions (gradient i is all i)."""
    n = len(versions)
    columns = {
        "gradient": torch.arange(n, dtype=torch.float32)[:, None].repeat(1, 3),
        "version": torch.tensor(versions),
    }
    return columns, torch.ones(n), np.arange(100, 100 + n, dtype=np.uint64)


def test_a_gradient_staler_than_max_staleness_is_dropped_and_counted():
    """At version 10 with max_staleness 2: versions 8 to 10 are kept, with their staleness;
    7 (3 behind) and 11 (a version the learner never published) are dropped and counted."""
    dataset = FreshGradients("default", max_staleness=2)
    batch, dropped = dataset.gather(gradients([7, 8, 10, 11, 9]), 10)
    columns, weights, keys = batch
    assert dropped == 2
    assert columns["staleness"].tolist() == [2, 0, 1]
    assert columns["gradient"][:, 0].tolist() == [1.0, 2.0, 4.0]
    assert keys.tolist() == [101, 102, 104] and len(weights) == 3


def test_a_batch_of_stale_gradients_alone_gives_nothing_to_train_on():
    dataset = FreshGradients("default", max_staleness=0)
    assert dataset.gather(gradients([9]), 10) == (None, 1)
    batch, dropped = dataset.gather(gradients([10]), 10)
    assert dropped == 0 and batch[0]["staleness"].tolist() == [0]


def test_the_dataset_takes_one_gradient_an_update_and_publishes_after_each():
    config = LearnerConfig(algorithm="a3c", batch_size=64, algo=Settings(max_staleness=3))
    dataset = algorithms.make(config).dataset()
    assert (dataset.batch_size, dataset.max_staleness) == (1, 3)
    assert dataset.publish_every_update and not dataset.prioritized


# --- the gradient column -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "hidden"),
    [("CartPole-v1", ""), ("CartPole-v1", "32,16,8"), ("Acrobot-v1", "7"), ("Pendulum-v1", "")],
)
def test_the_gradient_column_has_one_value_per_parameter_of_the_network(env, hidden):
    builder = algorithms.make(ActorConfig(algorithm="a3c", env=env, hidden=hidden))
    (gradient,) = [c for c in builder.columns() if c.name == "gradient"]
    assert gradient.shape == (sum(p.numel() for p in builder.network().parameters()),)


def test_the_gradient_column_counts_the_nature_cnn_of_frames():
    spec = EnvSpec("ALE/Pong-v5", (4, 84, 84), np.dtype(np.uint8), 6, (), None, None)
    net = ActorCriticNetwork(spec.obs_shape, spec.obs_dtype, 6, hidden_sizes("", "64,64"))
    assert gradient_size(spec, (64, 64)) == sum(p.numel() for p in net.parameters())


# --- settings ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"max_staleness": -1}, "max_staleness: must be >= 0, got -1"),
        ({"unroll_length": 0}, "unroll_length: must be >= 1, got 0"),
        ({"capacity": 0}, "capacity: must be >= 1, got 0"),
        ({"value_cost": -0.5}, "value_cost: must be >= 0, got -0.5"),
        ({"entropy_cost": math.nan}, "entropy_cost: must be >= 0, got nan"),
        ({"optimizer": "sgd"}, "optimizer: must be one of adam, rmsprop"),
        ({"optimizer_eps": 0.0}, "optimizer_eps: must be > 0, got 0.0"),
    ],
)
def test_settings_that_cannot_work_are_refused_by_name(settings, message):
    config = AgentConfig(algorithm="a3c", env="CartPole-v1", algo=Settings(**settings))
    with pytest.raises(ValueError) as refused:
        algorithms.make(config)
    assert str(refused.value).startswith(message), str(refused.value)


def test_a_box_action_space_of_more_than_one_dimension_is_refused_naming_the_algorithm():
    from apexrl.algorithms.a3c.builder import A3CBuilder

    spec = env_spec("Pendulum-v1")
    flat = EnvSpec(
        "Grid-v0", (3,), np.dtype(np.float32), 0, (2, 2), spec.action_low, spec.action_high
    )
    with pytest.raises(ValueError, match="algorithm: a3c acts in Discrete or 1-D Box action"):
        A3CBuilder(AgentConfig(algorithm="a3c"), flat)
