"""The dueling Q-network: a shared torso (algorithms/networks.py), then Q = V + A - mean(A).

Two options, each a setting of dqn:
- noisy heads (Fortunato et al. 2018): the value and advantage layers are NoisyLinear, whose
  factorised Gaussian noise is how the agent explores;
- a distributional head (C51, Bellemare et al. 2017): V and A are logits over `atoms` fixed
  returns from v_min to v_max, combined per atom as Rainbow does, then a softmax per action;
  Q is the distribution's mean.
"""

import math
from collections.abc import Sequence

import numpy.typing as npt
import torch
from torch import nn

from apexrl.algorithms.networks import build_torso


class NoisyLinear(nn.Module):
    """y = (mu_w + sigma_w * eps_w) x + mu_b + sigma_b * eps_b with factorised Gaussian noise:
    eps_w = f(eps_out) f(eps_in)^T, eps_b = f(eps_out), f(x) = sign(x) sqrt(|x|).

    Initialised as Fortunato et al.'s factorised case: mu ~ U(-1/sqrt(p), 1/sqrt(p)), sigma =
    sigma0 / sqrt(p), p the input width. `noise_scale` multiplies the noise (0: the mean
    weights alone, the evaluation policy); `reset_noise` draws a new sample. The noise is no
    parameter and no published state.
    """

    eps_in: torch.Tensor
    eps_out: torch.Tensor

    def __init__(self, in_features: int, out_features: int, sigma0: float = 0.5):
        super().__init__()
        if sigma0 <= 0:
            raise ValueError(f"sigma0: must be > 0, got {sigma0}")
        self.in_features, self.out_features = in_features, out_features
        bound = 1.0 / math.sqrt(in_features)
        self.weight_mu = nn.Parameter(
            torch.empty(out_features, in_features).uniform_(-bound, bound)
        )
        self.bias_mu = nn.Parameter(torch.empty(out_features).uniform_(-bound, bound))
        self.weight_sigma = nn.Parameter(torch.full((out_features, in_features), sigma0 * bound))
        self.bias_sigma = nn.Parameter(torch.full((out_features,), sigma0 * bound))
        self.register_buffer("eps_in", torch.zeros(in_features), persistent=False)
        self.register_buffer("eps_out", torch.zeros(out_features), persistent=False)
        self.noise_scale = 1.0
        self.reset_noise()

    @staticmethod
    def _f(x: torch.Tensor) -> torch.Tensor:
        return x.sign() * x.abs().sqrt()

    def reset_noise(self) -> None:
        self.eps_in.copy_(self._f(torch.randn_like(self.eps_in)))
        self.eps_out.copy_(self._f(torch.randn_like(self.eps_out)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.noise_scale == 0:
            return nn.functional.linear(x, self.weight_mu, self.bias_mu)
        eps_out = self.eps_out * self.noise_scale
        weight = self.weight_mu + self.weight_sigma * torch.outer(eps_out, self.eps_in)
        return nn.functional.linear(x, weight, self.bias_mu + self.bias_sigma * eps_out)


class QNetwork(nn.Module):
    """Torso followed by a dueling head; forward returns Q-values [B, num_actions]; with
    `support` (the C51 atoms), `log_probs` returns log-probabilities [B, num_actions, atoms]."""

    support: torch.Tensor | None

    def __init__(
        self,
        torso: nn.Module,
        feature_dim: int,
        num_actions: int,
        support: torch.Tensor | None = None,
        sigma0: float | None = None,
    ):
        super().__init__()
        self.torso = torso
        self.num_actions = num_actions
        atoms = 1 if support is None else len(support)
        self.atoms = atoms

        def linear(out_features: int) -> nn.Module:
            if sigma0 is None:
                return nn.Linear(feature_dim, out_features)
            return NoisyLinear(feature_dim, out_features, sigma0)

        self.value = linear(atoms)
        self.advantage = linear(num_actions * atoms)
        # Derived from the settings, so never published: actors build the same one.
        self.register_buffer("support", support, persistent=False)

    def _dueling(self, obs: torch.Tensor) -> torch.Tensor:
        """V + A - mean(A), [B, num_actions, atoms]: subtracting the mean advantage makes V
        and A identifiable (Wang et al. 2016); per atom for C51, as in Rainbow."""
        features = self.torso(obs)
        value = self.value(features).view(-1, 1, self.atoms)
        advantage = self.advantage(features).view(-1, self.num_actions, self.atoms)
        return value + advantage - advantage.mean(dim=1, keepdim=True)

    def log_probs(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(self._dueling(obs).float(), dim=2)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if self.support is None:
            return self._dueling(obs).squeeze(2)
        return (self.log_probs(obs).exp() * self.support).sum(dim=2)


def set_noise(net: nn.Module, scale: float | None = None) -> None:
    """Draws new noise in every noisy layer of `net`; with `scale`, sets their noise scale."""
    for module in net.modules():
        if isinstance(module, NoisyLinear):
            module.reset_noise()
            if scale is not None:
                module.noise_scale = scale


def build_network(
    obs_shape: Sequence[int],
    obs_dtype: npt.DTypeLike,
    num_actions: int,
    hidden: Sequence[int] = (128, 128),
    *,
    sigma0: float | None = None,
    atoms: int = 0,
    v_min: float = -10.0,
    v_max: float = 10.0,
) -> QNetwork:
    """MLP torso for 1-D float obs, Nature conv torso for uint8 [C, H, W] obs; noisy heads
    with `sigma0`, a C51 head with `atoms` (>= 2) spread evenly over [v_min, v_max]."""
    if num_actions < 1:
        raise ValueError(f"num_actions must be >= 1, got {num_actions}")
    support = None
    if atoms:
        if atoms < 2:
            raise ValueError(f"atoms: must be >= 2, got {atoms}")
        if not v_min < v_max:
            raise ValueError(f"v_min: must be < v_max, got v_min {v_min}, v_max {v_max}")
        support = torch.linspace(v_min, v_max, atoms)
    torso = build_torso(obs_shape, obs_dtype, hidden)
    return QNetwork(torso, torso.out_dim, num_actions, support, sigma0)
