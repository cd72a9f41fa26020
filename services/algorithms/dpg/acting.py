"""Ape-X DPG's policy: the deterministic policy plus Gaussian action noise of a per-actor
scale."""

import numpy as np
import torch

from apexrl.algorithms.base import Policy
from apexrl.algorithms.dpg.losses import critic_loss
from apexrl.algorithms.dpg.networks import ActorCritic
from apexrl.algorithms.networks import load_numpy_state


class DPGPolicy(Policy):
    def __init__(self, nets: ActorCritic, low: np.ndarray, high: np.ndarray):
        self.nets = nets
        self.low, self.high = low, high

    def load(self, arrays: dict[str, np.ndarray]) -> None:
        load_numpy_state(self.nets, arrays)

    def act(self, obs: np.ndarray, exploration: float, rng: np.random.Generator) -> np.ndarray:
        """pi(obs) plus Gaussian noise of std `exploration` * (high - low) / 2 per dimension,
        clipped to the bounds; float32 [B, *action_shape]. Exploration 0: pi(obs) itself."""
        with torch.no_grad():
            actions = self.nets.policy(torch.from_numpy(obs)).numpy()
        if exploration > 0:
            noise = rng.standard_normal(actions.shape) * (exploration * (self.high - self.low) / 2)
            actions = np.clip(actions + noise, self.low, self.high)
        return actions.astype(np.float32, copy=False)

    def priorities(self, columns: dict[str, np.ndarray]) -> np.ndarray:
        """|TD error| with the actor's own policy and critic standing in for the targets."""
        batch = {name: torch.from_numpy(array) for name, array in columns.items()}
        policy, critic = self.nets.policy, self.nets.critic
        with torch.no_grad():
            weights = torch.ones(len(columns["reward"]))
            _, td_errors, _ = critic_loss(critic, policy, critic, batch, weights)
        return td_errors.abs().numpy().astype(np.float32)
