"""Noisy networks (Fortunato et al. 2018): factorised Gaussian noise, its statistics, its
initialisation, no noise in evaluation, and what an actor's step does with it."""

import math

import numpy as np
import pytest
import torch

from apexrl.algorithms.dqn.acting import DQNPolicy
from apexrl.algorithms.dqn.networks import NoisyLinear, build_network, set_noise


def test_initialisation_is_the_factorised_one():
    torch.manual_seed(0)
    layer = NoisyLinear(64, 8, sigma0=0.5)
    bound = 1 / math.sqrt(64)
    assert layer.weight_mu.abs().max() <= bound and layer.bias_mu.abs().max() <= bound
    torch.testing.assert_close(layer.weight_sigma, torch.full((8, 64), 0.5 * bound))
    torch.testing.assert_close(layer.bias_sigma, torch.full((8,), 0.5 * bound))


def noise_of(layer: NoisyLinear) -> tuple[torch.Tensor, torch.Tensor]:
    """The weight and bias noise of the current sample, read back through forward (sigma = 1)."""
    with torch.no_grad():
        layer.weight_sigma.fill_(1.0)
        layer.bias_sigma.fill_(1.0)
        eye = torch.eye(layer.in_features)
        noisy, mean = layer(eye), torch.nn.functional.linear(eye, layer.weight_mu, layer.bias_mu)
        bias_noise = layer(torch.zeros(1, layer.in_features))[0] - layer.bias_mu
        return (noisy - mean).T - bias_noise[:, None], bias_noise


def test_factorised_noise_statistics():
    torch.manual_seed(1)
    layer = NoisyLinear(6, 4)
    samples, biases = [], []
    for _ in range(4000):
        layer.reset_noise()
        weight, bias = noise_of(layer)
        # Factorised: the weight noise is the outer product of the bias (output) noise and an
        # input noise vector, so rank 1, and its column j is eps_out * f(eps_in_j).
        assert torch.linalg.matrix_rank(weight) == 1
        torch.testing.assert_close(weight, torch.outer(bias, weight[0] / bias[0]))
        samples.append(weight)
        biases.append(bias)
    weight, bias = torch.stack(samples), torch.stack(biases)
    # f(x) = sign(x) sqrt|x| of a standard normal: mean 0, E f(x)^2 = E|x| = sqrt(2/pi); a
    # product of two independent ones has variance 2/pi.
    assert weight.mean().abs() < 0.02 and bias.mean().abs() < 0.03
    assert abs(weight.var().item() - 2 / math.pi) < 0.03
    assert abs(bias.var().item() - math.sqrt(2 / math.pi)) < 0.03
    # The noise is drawn anew each time: two samples differ.
    assert not torch.equal(weight[0], weight[1])


def test_noise_is_neither_a_parameter_nor_published():
    net = build_network((4,), np.float32, 2, (8,), sigma0=0.5)
    names = set(net.state_dict())
    assert {"value.weight_sigma", "advantage.weight_mu"} <= names
    assert not any("eps" in name for name in names)
    assert not any("eps" in name for name, _ in net.named_parameters())


def test_sigma0_must_be_positive():
    with pytest.raises(ValueError, match="sigma0"):
        NoisyLinear(4, 2, sigma0=0.0)


def test_evaluation_has_no_noise_and_actors_do():
    torch.manual_seed(2)
    policy = DQNPolicy(build_network((4,), np.float32, 3, (16,), sigma0=0.5))
    obs = np.random.default_rng(0).standard_normal((64, 4)).astype(np.float32)
    rng = np.random.default_rng(0)
    greedy = policy.act(obs, 0.0, rng)
    for _ in range(5):
        np.testing.assert_array_equal(policy.act(obs, 0.0, rng), greedy)
    with torch.no_grad():
        set_noise(policy.net, 0.0)
        mean_q = policy.net(torch.from_numpy(obs))
        set_noise(policy.net, 1.0)
        assert not torch.allclose(policy.net(torch.from_numpy(obs)), mean_q)
    np.testing.assert_array_equal(greedy, mean_q.argmax(1).numpy())
    # An actor's step (epsilon 0: the ladder is off with noise) acts on a new sample each step.
    steps = [policy.step(obs, 0.0, rng)[0] for _ in range(5)]
    assert any(not np.array_equal(actions, greedy) for actions in steps)
    assert any(not np.array_equal(steps[0], actions) for actions in steps[1:])
