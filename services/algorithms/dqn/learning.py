"""Ape-X DQN's policy (epsilon-greedy) and learning (double DQN, dueling network, n-step)."""

import numpy as np
import torch

from apexrl.algorithms.base import Learning, Policy, prefixed
from apexrl.algorithms.dqn.losses import dqn_loss
from apexrl.algorithms.dqn.networks import QNetwork
from apexrl.algorithms.networks import (
    adam,
    load_numpy_state,
    load_optimizer_state,
    optimizer_state,
    state_to_numpy,
)


class DQNPolicy(Policy):
    def __init__(self, net: QNetwork):
        self.net = net

    def load(self, arrays: dict[str, np.ndarray]) -> None:
        load_numpy_state(self.net, arrays)

    def act(self, obs: np.ndarray, exploration: float, rng: np.random.Generator) -> np.ndarray:
        """Epsilon-greedy: a uniformly random action with probability `exploration`."""
        with torch.no_grad():
            greedy = self.net(torch.from_numpy(obs)).argmax(1).numpy()
        if exploration <= 0:
            return greedy
        explore = rng.random(len(obs)) < exploration
        return np.where(explore, rng.integers(self.net.num_actions, size=len(obs)), greedy)

    def priorities(self, columns: dict[str, np.ndarray]) -> np.ndarray:
        """|TD error| with the actor's own network as both online and target, as in Ape-X."""
        batch = {name: torch.from_numpy(array) for name, array in columns.items()}
        with torch.no_grad():
            _, td_errors, _ = dqn_loss(
                self.net, self.net, batch, torch.ones(len(columns["action"]))
            )
        return td_errors.abs().numpy().astype(np.float32)


class DQNLearning(Learning):
    def __init__(self, build, config, settings, device: torch.device):
        self.config, self.settings = config, settings
        self.online, self.target = build().to(device), build().to(device)
        self.target.load_state_dict(self.online.state_dict())
        self.optimizer = adam(self.online.parameters(), config.learning_rate)

    def update(self, batch, weights, step):
        loss, td_errors, q = dqn_loss(self.online, self.target, batch, weights)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.online.parameters(), self.config.max_grad_norm)
        self.optimizer.step()
        if step % self.settings.target_update_interval == 0:
            self.target.load_state_dict(self.online.state_dict())
        return td_errors.abs(), {"loss": loss.item(), "q_mean": q.mean().item()}

    def parameters(self) -> dict[str, np.ndarray]:
        return state_to_numpy(self.online)

    def state(self) -> tuple[dict[str, np.ndarray], dict]:
        arrays = {f"online/{k}": v for k, v in state_to_numpy(self.online).items()}
        arrays |= {f"target/{k}": v for k, v in state_to_numpy(self.target).items()}
        optimizer, groups = optimizer_state(self.optimizer, "optimizer")
        return arrays | optimizer, {"param_groups": groups}

    def load_state(self, arrays: dict[str, np.ndarray], meta: dict) -> None:
        load_numpy_state(self.online, prefixed(arrays, "online"))
        load_numpy_state(self.target, prefixed(arrays, "target"))
        load_optimizer_state(self.optimizer, arrays, "optimizer", meta["param_groups"])
