"""Running mean and variance of observations and of discounted returns, as Stable-Baselines3's
VecNormalize (and CleanRL's continuous PPO, through gymnasium's wrappers) keep them: observations
become (obs - mean) / sqrt(var + 1e-8), clipped to +-10; rewards are divided by the running std
of the discounted return (sqrt(var + 1e-8)), clipped to +-10.

The statistics are buffers of the actor-critic network: they are published with its parameters
(actors, the evaluator and `apexrl eval` read the same ones, under "obs_norm." and
"return_norm."), checkpointed with it, and kept in a best model. The learner owns them: it
normalizes a batch with the statistics its actors acted with (those published with the
version), and folds the batch into them after the update, for the next version.
"""

import torch
from torch import nn

EPSILON = 1e-8  # VecNormalize's, under the square root
CLIP = 10.0  # VecNormalize's clip_obs and clip_reward


class RunningMeanStd(nn.Module):
    """Mean and variance of everything update() has seen, merged batch by batch (Chan et al.'s
    parallel algorithm, as SB3's RunningMeanStd), float64; count starts at 1e-4 (SB3's), mean
    0 and variance 1. Every buffer has a dimension at least (the return's are [1]): published
    parameters are compared row by row."""

    mean: torch.Tensor
    var: torch.Tensor
    count: torch.Tensor

    def __init__(self, shape: tuple[int, ...] = (1,)):
        super().__init__()
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.full((1,), 1e-4, dtype=torch.float64))

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        """Folds in samples x [..., *shape] (every leading dimension a sample)."""
        x = x.detach().to(torch.float64).reshape(-1, *self.mean.shape)
        n = x.shape[0]
        if n == 0:
            return
        batch_mean, batch_var = x.mean(0), x.var(0, unbiased=False)
        delta, total = batch_mean - self.mean, self.count + n
        m2 = self.var * self.count + batch_var * n + delta.pow(2) * self.count * n / total
        self.mean += delta * n / total
        self.var.copy_(m2 / total)
        self.count.copy_(total)

    def std(self) -> torch.Tensor:
        return torch.sqrt(self.var + EPSILON).float()


class ObservationNormalizer(RunningMeanStd):
    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """(obs - mean) / std clipped to +-10, float32."""
        return ((obs.float() - self.mean.float()) / self.std()).clamp(-CLIP, CLIP)


def scaled_rewards(rewards: torch.Tensor, returns: RunningMeanStd) -> torch.Tensor:
    """rewards / the discounted return's std, clipped to +-10."""
    return (rewards / returns.std()).clamp(-CLIP, CLIP)
