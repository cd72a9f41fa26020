"""The dueling Q-network: a shared torso (algorithms/networks.py), then Q = V + A - mean(A)."""

from collections.abc import Sequence

import numpy.typing as npt
import torch
from torch import nn

from apexrl.algorithms.networks import build_torso


class QNetwork(nn.Module):
    """Torso followed by a dueling head; forward returns Q-values [B, num_actions]."""

    def __init__(self, torso: nn.Module, feature_dim: int, num_actions: int):
        super().__init__()
        self.torso = torso
        self.value = nn.Linear(feature_dim, 1)
        self.advantage = nn.Linear(feature_dim, num_actions)
        self.num_actions = num_actions

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        features = self.torso(obs)
        value = self.value(features)
        advantage = self.advantage(features)
        # Subtracting the mean advantage makes V and A identifiable (Wang et al. 2016).
        return value + advantage - advantage.mean(dim=1, keepdim=True)


def build_network(
    obs_shape: Sequence[int],
    obs_dtype: npt.DTypeLike,
    num_actions: int,
    hidden: Sequence[int] = (128, 128),
) -> QNetwork:
    """MLP torso for 1-D float obs, Nature conv torso for uint8 [C, H, W] obs."""
    if num_actions < 1:
        raise ValueError(f"num_actions must be >= 1, got {num_actions}")
    torso = build_torso(obs_shape, obs_dtype, hidden)
    return QNetwork(torso, torso.out_dim, num_actions)
