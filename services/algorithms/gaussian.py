"""The diagonal Gaussian policy of continuous (Box) actions, for impala, ppo and unreal.

As Stable-Baselines3's and CleanRL's continuous PPO: a linear mean head on the policy torso's
features and a state-independent, learned log standard deviation (one per action dimension,
`log_std_init` at first: 0, std 1, as SB3's default). The head's output is one tensor, the mean
and the log-std side by side [..., 2 * dims], so that a batch of policy outputs says everything
about its distributions (the learner's KL to the policy before an update reads it so).

Bounds: the policy samples the unbounded Gaussian, the env gets the sample clipped to the
action space, and the learner's log-probabilities are those of the unclipped sample (which the
actor records beside the clipped one), as SB3 and CleanRL do. The clipped distribution's mass on
the bounds is not what the gradient sees, but the log-probability stays exact and cheap and the
figures compare with theirs; a tanh squash (with its log-det correction) would change the
policy's shape near the bounds and the initial exploration that the baselines' settings assume.
Evaluation plays the clipped mean.

gSDE (generalized state-dependent exploration, Raffin et al. 2021, SB3's `use_sde`):
StateDependentHead. The actor's noise is phi(s) . W, phi the policy torso's features and W a
[features x dims] matrix of N(0, sigma^2) entries that the actor keeps for a few steps
(numpy_policies.StateDependentGaussian); sigma = exp(log_std) is learned, one per entry (SB3's
full_std). At a state, the noise is Gaussian with variance sum_i phi_i^2 sigma_ij^2: the head
outputs that state's log-std beside the mean, so that DiagGaussian reads it as it reads the
plain head's, and the learner needs no W. The features enter the variance detached (SB3's
learn_features=False): only sigma and the torso's policy gradient through the mean move them.
"""

import math

import torch
from torch import nn

LOG_2PI = math.log(2 * math.pi)
SDE_EPSILON = 1e-6  # added to a gSDE variance (SB3's), keeping its log finite


class GaussianHead(nn.Module):
    """mean = W features + b (orthogonal W, gain 0.01: a first policy centred on 0, as SB3's
    action net), log_std a parameter of its own, broadcast over the batch."""

    def __init__(self, features: int, dims: int, log_std_init: float = 0.0):
        super().__init__()
        self.mean = nn.Linear(features, dims)
        self.log_std = nn.Parameter(torch.full((dims,), float(log_std_init)))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        mean = self.mean(features).float()
        return torch.cat([mean, self.log_std.expand_as(mean)], -1)


class StateDependentHead(nn.Module):
    """mean as GaussianHead's; log_std [features, dims], sigma's log, `log_std_init` at first
    (SB3's PPO: 0). Output: the mean and log sqrt(phi^2 . sigma^2 + 1e-6) (SB3's epsilon)."""

    def __init__(self, features: int, dims: int, log_std_init: float = 0.0):
        super().__init__()
        self.mean = nn.Linear(features, dims)
        self.log_std = nn.Parameter(torch.full((features, dims), float(log_std_init)))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        mean = self.mean(features).float()
        phi = features.detach().float()
        variance = phi.pow(2) @ torch.exp(2 * self.log_std) + SDE_EPSILON
        return torch.cat([mean, 0.5 * torch.log(variance)], -1)


def split(out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, log_std) of a head's output [..., 2 * dims]."""
    dims = out.shape[-1] // 2
    return out[..., :dims], out[..., dims:]


class DiagGaussian:
    """The distribution of a GaussianHead's output: log pi(a) and entropy summed over the
    action dimensions, and the KL between two such outputs."""

    @staticmethod
    def evaluate(out: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(log pi(actions), entropy), each [...], for out [..., 2 * dims], actions [..., dims]."""
        mean, log_std = split(out)
        z = (actions - mean) * torch.exp(-log_std)
        log_prob = (-0.5 * z.pow(2) - log_std - 0.5 * LOG_2PI).sum(-1)
        entropy = (0.5 + 0.5 * LOG_2PI + log_std).sum(-1)
        return log_prob, entropy

    @staticmethod
    def kl(old_out: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """Mean over the samples of KL(pi_old || pi), summed over the dimensions:
        log(s / s_old) + (s_old^2 + (m_old - m)^2) / (2 s^2) - 1/2."""
        old_mean, old_log_std = split(old_out)
        mean, log_std = split(out)
        ratio = torch.exp(2 * (old_log_std - log_std))
        gap = (old_mean - mean).pow(2) * torch.exp(-2 * log_std)
        return (log_std - old_log_std + 0.5 * (ratio + gap) - 0.5).sum(-1).mean()
