"""R2D2's policy (epsilon-greedy on a recurrent Q-network, a state per env) and learning
(burn-in, n-step double Q on rescaled values, mixed sequence priorities)."""

import numpy as np
import torch

from apexrl.algorithms.base import Learning, Policy, prefixed
from apexrl.algorithms.networks import (
    adam,
    load_numpy_state,
    load_optimizer_state,
    optimizer_state,
    state_to_numpy,
)
from apexrl.algorithms.r2d2.losses import r2d2_loss
from apexrl.algorithms.r2d2.networks import RecurrentQNetwork


class R2D2Policy(Policy):
    """Keeps the recurrent state of every env it acts in; an env's state starts at zero with
    each of its episodes."""

    def __init__(self, net: RecurrentQNetwork, settings):
        self.net, self.settings = net, settings
        self.state = np.zeros((0, net.state_size), np.float32)

    def load(self, arrays: dict[str, np.ndarray]) -> None:
        load_numpy_state(self.net, arrays)

    def episode_starts(self, starts: np.ndarray) -> None:
        starts = np.asarray(starts, bool)
        if len(starts) != len(self.state):
            self.state = np.zeros((len(starts), self.net.state_size), np.float32)
        self.state[starts] = 0.0

    def keep_envs(self, envs: np.ndarray) -> None:
        self.state = self.state[np.asarray(envs, np.int64)]

    def step(self, obs, exploration, rng):
        """Epsilon-greedy actions; the extras are the state each env acted from and the
        exploration parameter, which the sequence adder stores."""
        if len(obs) != len(self.state):  # a caller that never said: new envs, at their starts
            self.episode_starts(np.ones(len(obs), bool))
        before = self.state
        with torch.no_grad():
            q, after = self.net.unroll(torch.from_numpy(obs).unsqueeze(1), torch.from_numpy(before))
        self.state = after.numpy()
        greedy = q[:, 0].argmax(1).numpy()
        explore = rng.random(len(obs)) < exploration
        actions = np.where(explore, rng.integers(self.net.num_actions, size=len(obs)), greedy)
        return actions, {"state": before, "exploration": np.full(len(obs), exploration, np.float32)}

    def act(self, obs, exploration, rng):
        return self.step(obs, exploration, rng)[0]

    def priorities(self, items: dict[str, np.ndarray]) -> np.ndarray:
        """The learner's priorities with the actor's own network as online and target (Ape-X's
        and R2D2's initial priorities)."""
        batch = {name: torch.from_numpy(np.asarray(array)) for name, array in items.items()}
        s = self.settings
        with torch.no_grad():
            _, priorities, _ = r2d2_loss(self.net, self.net, batch, torch.ones(len(batch["mask"])),
                                         s.burn_in, s.n_step, s.priority_eta)  # fmt: skip
        return priorities.numpy().astype(np.float32)


class R2D2Learning(Learning):
    def __init__(self, build, config, settings, device: torch.device):
        self.config, self.settings = config, settings
        self.online, self.target = build().to(device), build().to(device)
        self.target.load_state_dict(self.online.state_dict())
        self.optimizer = adam(self.online.parameters(), config.learning_rate)

    def update(self, batch, weights, step):
        s = self.settings
        loss, priorities, q_mean = r2d2_loss(
            self.online, self.target, batch, weights, s.burn_in, s.n_step, s.priority_eta
        )
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.online.parameters(), self.config.max_grad_norm)
        self.optimizer.step()
        if step % s.target_update_interval == 0:
            self.target.load_state_dict(self.online.state_dict())
        return priorities, {"loss": loss.item(), "q_mean": q_mean.item()}

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
