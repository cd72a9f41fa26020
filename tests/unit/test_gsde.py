"""gSDE (gaussian.StateDependentHead, numpy_policies.StateDependentGaussian): the learner's
log-probabilities and entropy are those of a Normal at the state-dependent std, the actor's
noise is phi(s) . W for a W held `sde_sample_freq` steps of each env, and settings it cannot
take are refused by name."""

import numpy as np
import pytest
import torch
from torch.distributions import Independent, Normal

from apexrl import algorithms
from apexrl.algorithms.gaussian import DiagGaussian, StateDependentHead
from apexrl.algorithms.networks import state_to_numpy
from apexrl.algorithms.numpy_policies import StateDependentGaussian
from apexrl.config import ActorConfig


def builder(env: str = "Pendulum-v1", algorithm: str = "ppo", **settings):
    config = ActorConfig(algorithm=algorithm, env=env, hidden="16,8")
    config.algo = algorithms.get(algorithm).Settings(**settings)
    return algorithms.make(config)


def by_hand(head: StateDependentHead, phi: torch.Tensor) -> Independent:
    """N(mean, sqrt(sum_i phi_i^2 sigma_ij^2 + 1e-6)) per action dimension j."""
    sigma = head.log_std.detach().exp()
    variance = (phi[:, :, None] ** 2 * sigma[None] ** 2).sum(1) + 1e-6
    return Independent(Normal(head.mean(phi).detach(), variance.sqrt()), 1)


def test_log_prob_and_entropy_are_a_normal_at_the_state_dependent_std():
    torch.manual_seed(0)
    head = StateDependentHead(6, 2, log_std_init=-1.0)
    with torch.no_grad():
        head.log_std.normal_(-1.0, 0.5)  # a sigma per feature and action dimension
    phi = torch.randn(32, 6).tanh().requires_grad_()
    actions = torch.randn(32, 2)
    log_prob, entropy = DiagGaussian.evaluate(head(phi), actions)
    expected = by_hand(head, phi.detach())
    torch.testing.assert_close(log_prob, expected.log_prob(actions))
    torch.testing.assert_close(entropy, expected.entropy())
    assert entropy.std() > 0.1  # the std differs across states
    entropy.sum().backward()  # the features reach the variance detached (learn_features=False)
    assert phi.grad is None or not phi.grad.any()
    assert head.log_std.grad is not None and head.log_std.grad.abs().sum() > 0


def test_the_actors_noise_is_phi_times_a_matrix_held_sample_freq_steps():
    """One observation in every env (fixed features): an env's noise (action - mean) stays the
    same for 3 steps, then changes; across 4000 envs its spread is the state's std; an episode
    start draws that env's W again at once."""
    b = builder(sde_sample_freq=3, log_std_init=-0.5)
    policy, net = b.policy(), b.network()
    torch.manual_seed(1)
    with torch.no_grad():
        net.gaussian.log_std.normal_(-0.5, 0.3)
    policy.load(state_to_numpy(net))
    assert isinstance(policy.actions, StateDependentGaussian)
    obs = np.tile(np.array([[0.3, -0.8, 1.5]], np.float32), (4000, 1))
    rng = np.random.default_rng(2)
    policy.episode_starts(np.ones(4000, bool))
    mean = policy.act(obs, 0.0, rng)  # the evaluator's: the mean (inside Pendulum's bounds)
    noises = [policy.step(obs, 1.0, rng)[1]["sampled_actions"] - mean for _ in range(7)]
    for held in (noises[1], noises[2]):
        np.testing.assert_array_equal(held, noises[0])
    np.testing.assert_array_equal(noises[4], noises[3])
    assert (noises[3] != noises[0]).all() and (noises[6] != noises[3]).all()
    with torch.no_grad():
        out = net.policy(torch.from_numpy(obs[:1]))
    np.testing.assert_allclose(mean[:1], out[:, :1].numpy(), rtol=1e-5, atol=1e-6)
    std = float(out[0, 1].exp())
    assert noises[0].std() == pytest.approx(std, rel=0.05) and abs(noises[0].mean()) < 0.1 * std
    starts = np.zeros(4000, bool)
    starts[:10] = True
    policy.episode_starts(starts)
    again = policy.step(obs, 1.0, rng)[1]["sampled_actions"] - mean  # step 8 of W #3
    assert (again[:10] != noises[6][:10]).all()
    np.testing.assert_array_equal(again[10:], noises[6][10:])


def test_the_actors_log_probs_are_the_learners():
    b = builder(sde_sample_freq=4)
    policy, net = b.policy(), b.network()
    torch.manual_seed(5)
    with torch.no_grad():
        net.gaussian.log_std.normal_(0.0, 0.5)
    policy.load(state_to_numpy(net))
    obs = np.random.default_rng(3).normal(0, 1, (64, 3)).astype(np.float32)
    policy.episode_starts(np.ones(64, bool))
    actions, extras = policy.step(obs, 1.0, np.random.default_rng(4))
    samples = torch.from_numpy(extras["sampled_actions"])
    with torch.no_grad():
        log_prob, _ = DiagGaussian.evaluate(net.policy(torch.from_numpy(obs)), samples)
    np.testing.assert_allclose(extras["log_probs"], log_prob.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(actions, np.clip(extras["sampled_actions"], -2.0, 2.0))
    assert np.abs(actions).max() == 2.0  # sigma near 1: std near ||phi||, often past the bounds


@pytest.mark.parametrize(
    "env,settings,message",
    [
        ("CartPole-v1", {"sde_sample_freq": 4}, r"sde_sample_freq: gSDE explores Box actions;"),
        ("Pendulum-v1", {"sde_sample_freq": -1}, r"sde_sample_freq: must be >= 0 \(0: off\)"),
    ],
)
def test_settings_gsde_cannot_take_are_refused(env, settings, message):
    with pytest.raises(ValueError, match=message):
        builder(env, **settings)


def test_only_ppo_has_the_setting():
    with pytest.raises(TypeError, match="sde_sample_freq"):
        algorithms.get("impala").Settings(sde_sample_freq=4)
