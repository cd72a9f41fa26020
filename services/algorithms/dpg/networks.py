"""The deterministic policy pi(s) and the critic Q(s, a), on the shared torsos
(algorithms/networks.py), kept together in one module so that their weights publish as one flat
dict: "policy.<...>" and "critic.<...>" (actors need both: the critic for initial priorities).
"""

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import torch
from torch import nn

from apexrl.algorithms.networks import MLPTorso, Torso, build_torso


class DeterministicPolicy(nn.Module):
    """Torso, a linear layer, tanh, scaled to the action bounds: actions [B, *action_shape] in
    [low, high] whatever the weights."""

    center: torch.Tensor
    half_range: torch.Tensor

    def __init__(self, torso: Torso, low: np.ndarray, high: np.ndarray):
        super().__init__()
        self.torso = torso
        self.action_shape = tuple(low.shape)
        self.head = nn.Linear(torso.out_dim, int(np.prod(self.action_shape, dtype=np.int64)))
        low_t = torch.as_tensor(low, dtype=torch.float32).flatten()
        high_t = torch.as_tensor(high, dtype=torch.float32).flatten()
        # Constants of the env, not weights: not persistent, so they are neither published nor
        # checkpointed, yet they follow the module to the device.
        self.register_buffer("center", (high_t + low_t) / 2, persistent=False)
        self.register_buffer("half_range", (high_t - low_t) / 2, persistent=False)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        squashed = torch.tanh(self.head(self.torso(obs)))
        return (self.center + self.half_range * squashed).reshape(-1, *self.action_shape)


class Critic(nn.Module):
    """Q(s, a) [B]: an MLP on concat(obs features, action).

    Vector observations enter as they are (cast to float32: envs may give float64); image
    observations go through the conv torso first.
    """

    def __init__(self, obs_torso: Torso, action_dim: int, hidden: Sequence[int]):
        super().__init__()
        self.obs_torso = obs_torso
        self.mlp = MLPTorso(obs_torso.out_dim + action_dim, hidden)
        self.head = nn.Linear(self.mlp.out_dim, 1)

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        features = torch.cat([self.obs_torso(obs), action.flatten(1).float()], dim=1)
        return self.head(self.mlp(features)).squeeze(1)


class ActorCritic(nn.Module):
    """The pair the learner trains, targets copy and actors load."""

    def __init__(self, policy: DeterministicPolicy, critic: Critic):
        super().__init__()
        self.policy, self.critic = policy, critic


def build_actor_critic(
    obs_shape: Sequence[int],
    obs_dtype: npt.DTypeLike,
    action_low: np.ndarray,
    action_high: np.ndarray,
    hidden: Sequence[int] = (256, 256),
) -> ActorCritic:
    """Policy and critic with the same hidden sizes, each its own weights (no shared torso)."""
    low, high = np.asarray(action_low, np.float32), np.asarray(action_high, np.float32)
    if low.shape != high.shape or not (low < high).all():
        raise ValueError(f"action bounds: need low < high elementwise, got {low} and {high}")
    policy = DeterministicPolicy(build_torso(obs_shape, obs_dtype, hidden), low, high)
    # No hidden layers: for vector obs just the float32 cast; for images the conv stack.
    obs_torso = build_torso(obs_shape, obs_dtype, ())
    critic = Critic(obs_torso, int(np.prod(low.shape, dtype=np.int64)), hidden)
    return ActorCritic(policy, critic)
