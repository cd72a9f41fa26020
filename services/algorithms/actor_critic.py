"""What impala and ppo share: an actor-critic network, its policy (actors sample it and record
the log-probabilities; evaluation takes the most likely action) and the parts of their learning
that do not differ (the forward pass over a batch of unrolls, parameters, checkpoints).

Unrolls arrive batch-major from the replay ([B, T(+1), ...], actor/unroll.py) and are turned
time-major ([T, B]) here, as the V-trace and GAE recursions read them.
"""

import functools
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from apexrl.algorithms.base import Learning, Policy, prefixed
from apexrl.algorithms.networks import (
    NatureConvTorso,
    adam,
    build_torso,
    load_numpy_state,
    load_optimizer_state,
    optimizer_state,
    state_to_numpy,
)
from apexrl.algorithms.numpy_policies import draw


class ActorCriticNetwork(nn.Module):
    """Policy logits and state value, built as Stable-Baselines3's policies (and CleanRL's PPO)
    build them: for vector observations two tanh MLP torsos of the same shape (the value loss
    does not pull on the policy's features, SB3's MlpPolicy); for images one Nature conv torso
    (ReLU) under both heads (SB3's CnnPolicy, A2C's, IMPALA's and UNREAL's networks), whose
    features the value loss trains too: with a conv torso of its own, shaped by the policy
    gradient alone, impala's Pong policy was still near uniform after 1.8M frames (entropy
    1.786 of ln 6 = 1.792). Orthogonal weights with gain sqrt(2) in the torsos, 0.01 on the
    logits (a near-uniform first policy) and 1 on the value, zero biases. Outputs leave a
    bfloat16 autocast (`precision`) as float32: V-trace, GAE and the log-softmax run in float32."""

    def __init__(self, obs_shape, obs_dtype, num_actions: int, hidden):
        super().__init__()
        self.policy_torso = build_torso(obs_shape, obs_dtype, hidden, nn.Tanh)
        self.value_torso = (
            None  # the value head reads the policy's CNN
            if isinstance(self.policy_torso, NatureConvTorso)
            else build_torso(obs_shape, obs_dtype, hidden, nn.Tanh)
        )
        self.logits = nn.Linear(self.policy_torso.out_dim, num_actions)
        self.value = nn.Linear(self.policy_torso.out_dim, 1)
        self.num_actions = num_actions
        for module, gain in [(self.policy_torso, 2**0.5), (self.value_torso, 2**0.5),
                             (self.logits, 0.01), (self.value, 1.0)]:  # fmt: skip
            for layer in module.modules() if module is not None else ():
                if isinstance(layer, nn.Linear | nn.Conv2d):
                    nn.init.orthogonal_(layer.weight, gain)
                    nn.init.zeros_(layer.bias)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.policy_torso(obs)
        value_features = features if self.value_torso is None else self.value_torso(obs)
        return self.logits(features).float(), self.value(value_features).squeeze(-1).float()

    def policy(self, obs: torch.Tensor) -> torch.Tensor:
        """The logits alone (acting needs no value: half the forward pass of the MLPs)."""
        return self.logits(self.policy_torso(obs)).float()

    def values(self, obs: torch.Tensor) -> torch.Tensor:
        """V(obs) [B] alone."""
        torso = self.policy_torso if self.value_torso is None else self.value_torso
        return self.value(torso(obs)).squeeze(-1).float()


class ActorCriticPolicy(Policy):
    def __init__(self, net: ActorCriticNetwork):
        self.net = net

    def load(self, arrays: dict[str, np.ndarray]) -> None:
        load_numpy_state(self.net, arrays)

    def act(self, obs: np.ndarray, exploration: float, rng: np.random.Generator) -> np.ndarray:
        """Evaluation (exploration 0): the most likely action; otherwise a sample."""
        if exploration > 0:
            return self.sample(obs, rng)[0]
        with torch.no_grad():
            return self.net.policy(torch.from_numpy(obs)).argmax(1).numpy()

    def step(self, obs, exploration, rng):
        """Actors sample the policy and record the log-probabilities (the adder's
        "log_probs")."""
        actions, log_probs = self.sample(obs, rng)
        return actions, {"log_probs": log_probs}

    def sample(self, obs: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Actions drawn from the policy (with the actor's numpy generator) and their
        log-probabilities, float32 [B]."""
        with torch.no_grad():
            log_probs = torch.log_softmax(self.net.policy(torch.from_numpy(obs)), 1).numpy()
        return draw(log_probs, rng)

    def values(self, obs: np.ndarray) -> np.ndarray:
        """V(obs) [B] (an actor bootstraps a truncated episode's last reward with it)."""
        with torch.no_grad():
            return self.net.values(torch.from_numpy(obs)).numpy()

    def priorities(self, items: dict[str, np.ndarray]) -> np.ndarray:
        """Unrolls are consumed in order, not by priority: all 1."""
        return np.ones(len(items["actions"]), np.float32)


class UnrollLearning(Learning):
    """One network and its Adam; subclasses define update()."""

    def __init__(
        self, build: Callable[[], ActorCriticNetwork], config, settings, device: torch.device
    ):
        self.config, self.settings = config, settings
        self.net = build().to(device)

    @functools.cached_property
    def optimizer(self) -> torch.optim.Optimizer:
        """Made on first use (see networks.adam): Adam, or RMSProp with decay 0.99 and no momentum
        (A2C's and IMPALA's), at the settings' epsilon (1e-5: Stable-Baselines3's and CleanRL's
        PPO and A2C; torch's default is 1e-8)."""
        lr, eps = self.config.learning_rate, self.settings.optimizer_eps
        if self.settings.optimizer == "rmsprop":
            return torch.optim.RMSprop(self.net.parameters(), lr, alpha=0.99, eps=eps, foreach=True)
        return adam(self.net.parameters(), lr, eps=eps)

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.optimizer]

    def forward(self, batch: dict[str, torch.Tensor]):
        """logits [T, B, A], values [T, B] and the bootstrap values [B] of a batch of unrolls."""
        obs = batch["observations"]
        b, t1 = obs.shape[:2]
        logits, values = self.net(obs.reshape(b * t1, *obs.shape[2:]))
        logits = logits.reshape(b, t1, -1).transpose(0, 1)
        values = values.reshape(b, t1).transpose(0, 1)
        return logits[:-1], values[:-1], values[-1]

    @staticmethod
    def time_major(batch: dict[str, torch.Tensor], name: str) -> torch.Tensor:
        return batch[name].transpose(0, 1)

    def step(self, loss: torch.Tensor) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.net.parameters(), self.config.max_grad_norm)
        self.optimizer.step()

    def parameters(self) -> dict[str, np.ndarray]:
        return state_to_numpy(self.net)

    def state(self) -> tuple[dict[str, np.ndarray], dict]:
        arrays = {f"online/{k}": v for k, v in state_to_numpy(self.net).items()}
        optimizer, groups = optimizer_state(self.optimizer, "optimizer")
        return arrays | optimizer, {"param_groups": groups}

    def load_state(self, arrays: dict[str, np.ndarray], meta: dict) -> None:
        load_numpy_state(self.net, prefixed(arrays, "online"))
        load_optimizer_state(self.optimizer, arrays, "optimizer", meta["param_groups"])
