"""The on-policy learners' update against a reference computation: ppo's and impala's update
on a fixed network and a fixed batch of unrolls must move the parameters by exactly the
gradient of the published loss, worked out here from the papers' equations with plain loops
(the targets in float64) (Schulman et al. 2016 and 2017 for GAE and PPO; Espeholt et al. 2018 for V-trace).

The learner's optimizer is replaced by SGD with a large learning rate and gradient clipping
is set out of reach, so the parameter change divided by the rate is the learner's gradient.
A learner that flips the advantages' sign, or feeds V-trace its rewards for discounts, moves
the parameters elsewhere and fails.
"""

import copy

import numpy as np
import pytest
import torch

from apexrl import algorithms
from apexrl.config import LearnerConfig

B, T = 3, 6  # unrolls in the batch, steps in each
LR = 1000.0  # the parameter change is LR x gradient: far above float32's rounding of it


def fixed_batch(builder) -> dict[str, torch.Tensor]:
    """Unrolls as the replay hands them over: batch-major, actions 0 or 1, behaviour
    probabilities of 0.2 to 0.8 (so some PPO ratios fall outside the clip), rewards of either
    sign, terminals at some steps (discount 0)."""
    rng = np.random.default_rng(26)
    obs_shape = builder.spec.obs_shape
    discounts = np.where(rng.random((B, T)) < 0.2, 0.0, 0.99)
    return {
        "observations": torch.from_numpy(rng.normal(size=(B, T + 1, *obs_shape))).float(),
        "actions": torch.from_numpy(rng.integers(0, 2, (B, T))),
        "rewards": torch.from_numpy(rng.normal(size=(B, T))).float(),
        "discounts": torch.from_numpy(discounts).float(),
        "log_probs": torch.from_numpy(np.log(rng.uniform(0.2, 0.8, (B, T)))).float(),
        "version": torch.ones(B, dtype=torch.int64),
    }


def learner_gradient(algorithm: str, **settings):
    """(the gradient the learner's update applied, by parameter name; the network before the
    update; the batch; the settings)."""
    builder_class = algorithms.get(algorithm)
    config = LearnerConfig(
        algorithm=algorithm, env="CartPole-v1", batch_size=B, max_grad_norm=1e9,
        algo=builder_class.Settings(unroll_length=T, **settings),
    )  # fmt: skip
    builder = algorithms.make(config)
    torch.manual_seed(0)
    learning = builder.learning(config, torch.device("cpu"))
    learning.optimizer = torch.optim.SGD(learning.net.parameters(), lr=LR)
    before = copy.deepcopy(learning.net)
    batch = fixed_batch(builder)
    learning.update(batch, torch.ones(B), 1)
    gradient = {
        name: (old.detach() - new.detach()).double() / LR
        for (name, old), new in zip(
            before.named_parameters(), learning.net.parameters(), strict=True
        )
    }
    return gradient, before, batch, builder.settings


def forward(net, batch):
    """The network's logits [B, T, A] and values [B, T + 1], in float64."""
    obs = batch["observations"]
    logits, values = net(obs.reshape(B * (T + 1), -1))
    return logits.double().reshape(B, T + 1, -1)[:, :T], values.double().reshape(B, T + 1)


def reference_gradient(net, loss: torch.Tensor) -> dict[str, torch.Tensor]:
    loss.backward()
    return {name: p.grad.double() for name, p in net.named_parameters()}


def assert_same_gradient(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for name in got:
        torch.testing.assert_close(got[name], want[name], rtol=1e-3, atol=1e-6, msg=name)


def ppo_reference(net, batch, s) -> dict[str, torch.Tensor]:
    """One epoch, one minibatch of PPO's clipped objective (paper eq. 7 and 9) with GAE."""
    logits, values = forward(net, batch)
    v = values.detach().numpy()
    r, d = batch["rewards"].double().numpy(), batch["discounts"].double().numpy()
    advantages = np.zeros((B, T))
    for b in range(B):
        acc = 0.0
        for t in reversed(range(T)):
            delta = r[b, t] + d[b, t] * v[b, t + 1] - v[b, t]  # v[b, T]: the bootstrap
            acc = delta + d[b, t] * s.gae_lambda * acc
            advantages[b, t] = acc
    returns = torch.from_numpy(advantages + v[:, :T])
    a = (advantages - advantages.mean()) / (advantages.std(ddof=1) + 1e-8)
    a = torch.from_numpy(a)
    log_pi_all = torch.log_softmax(logits, -1)
    log_pi = log_pi_all.gather(-1, batch["actions"].unsqueeze(-1)).squeeze(-1)
    ratio = torch.exp(log_pi - batch["log_probs"].double())
    clipped = ratio.clamp(1 - s.clip_range, 1 + s.clip_range)
    policy = -torch.minimum(ratio * a, clipped * a).mean()
    value = ((values[:, :T] - returns) ** 2).mean()
    entropy = -(log_pi_all.exp() * log_pi_all).sum(-1).mean()
    return reference_gradient(net, policy + s.value_cost * value - s.entropy_cost * entropy)


def impala_reference(net, batch, s) -> dict[str, torch.Tensor]:
    """One step of the IMPALA loss (paper eq. 1 and section 4.2, means over the steps) on
    V-trace targets with rho-bar = c-bar = 1."""
    logits, values = forward(net, batch)
    v = values.detach().numpy()
    r, d = batch["rewards"].double().numpy(), batch["discounts"].double().numpy()
    log_pi_all = torch.log_softmax(logits, -1)
    log_pi = log_pi_all.gather(-1, batch["actions"].unsqueeze(-1)).squeeze(-1)
    rho = np.exp(log_pi.detach().numpy() - batch["log_probs"].double().numpy())
    vs = np.zeros((B, T + 1))
    advantages = np.zeros((B, T))
    for b in range(B):
        vs[b, T] = v[b, T]
        for t in reversed(range(T)):
            delta = min(1.0, rho[b, t]) * (r[b, t] + d[b, t] * v[b, t + 1] - v[b, t])
            c = s.gae_lambda * min(1.0, rho[b, t])
            vs[b, t] = v[b, t] + delta + d[b, t] * c * (vs[b, t + 1] - v[b, t + 1])
        for t in range(T):
            advantages[b, t] = min(1.0, rho[b, t]) * (r[b, t] + d[b, t] * vs[b, t + 1] - v[b, t])
    policy = -(log_pi * torch.from_numpy(advantages)).mean()
    baseline = 0.5 * ((torch.from_numpy(vs[:, :T]) - values[:, :T]) ** 2).mean()
    entropy = -(log_pi_all.exp() * log_pi_all).sum(-1).mean()
    return reference_gradient(net, policy + s.value_cost * baseline - s.entropy_cost * entropy)


@pytest.mark.parametrize("entropy_cost", [0.0, 0.01])
def test_ppo_update_is_the_gradient_of_the_clipped_objective_on_gae(entropy_cost):
    got, before, batch, settings = learner_gradient(
        "ppo", epochs=1, minibatches=1, gae_lambda=0.9, entropy_cost=entropy_cost
    )
    assert_same_gradient(got, ppo_reference(before, batch, settings))


@pytest.mark.parametrize("lam", [1.0, 0.8])
def test_impala_update_is_the_gradient_of_the_loss_on_vtrace_targets(lam):
    got, before, batch, settings = learner_gradient("impala", passes=1, gae_lambda=lam)
    assert_same_gradient(got, impala_reference(before, batch, settings))


def test_the_reference_batch_exercises_clipping_and_terminals():
    """The batch is not a degenerate case: some ratios leave PPO's clip (and V-trace's), and
    some steps end an episode, so each part of the loss counts."""
    builder = algorithms.make(LearnerConfig(algorithm="ppo", env="CartPole-v1"))
    batch = fixed_batch(builder)
    ratios = 0.5 / batch["log_probs"].exp()  # the first policy is near-uniform over 2 actions
    assert (ratios > 1.2).any() and (ratios < 0.8).any() and (ratios > 1.0).any()
    assert (batch["discounts"] == 0).any() and (batch["discounts"] > 0).any()
    assert (batch["rewards"] < 0).any() and (batch["rewards"] > 0).any()
