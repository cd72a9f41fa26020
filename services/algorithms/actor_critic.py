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
from apexrl.algorithms.gaussian import DiagGaussian, GaussianHead, StateDependentHead
from apexrl.algorithms.networks import (
    NatureConvTorso,
    adam,
    build_torso,
    load_numpy_state,
    load_optimizer_state,
    optimizer_state,
    state_to_numpy,
)
from apexrl.algorithms.normalizer import ObservationNormalizer, RunningMeanStd, scaled_rewards
from apexrl.algorithms.numpy_policies import ActionHead, Softmax
from apexrl.algorithms.ppo.losses import Categorical


class ActorCriticNetwork(nn.Module):
    """Policy logits (or a Gaussian's mean and log-std: gaussian.py) and state value, built as
    Stable-Baselines3's policies (and CleanRL's PPO) build them: for vector observations two tanh
    MLP torsos of the same shape (the value loss does not pull on the policy's features, SB3's
    MlpPolicy); for images one Nature conv torso (ReLU) under both heads (SB3's CnnPolicy,
    A2C's, IMPALA's and UNREAL's networks), whose features the value loss trains too: with a
    conv torso of its own, shaped by the policy gradient alone, impala's Pong policy was still
    near uniform after 1.8M frames (entropy 1.786 of ln 6 = 1.792). Orthogonal weights with
    gain sqrt(2) in the torsos, 0.01 on the logits or the mean (a near-uniform first policy) and
    1 on the value, zero biases. Outputs leave a bfloat16 autocast (`precision`) as float32:
    V-trace, GAE and the log-softmax run in float32."""

    def __init__(
        self,
        obs_shape,
        obs_dtype,
        num_actions: int,
        hidden,
        *,
        action_dims: int = 0,
        log_std_init: float = 0.0,
        state_dependent: bool = False,
        normalize_obs: bool = False,
        normalize_returns: bool = False,
    ):
        """num_actions > 0: a softmax policy over them (logits); else a diagonal Gaussian over
        `action_dims` continuous actions (gaussian.py; its gSDE head with state_dependent).
        normalize_obs and normalize_returns
        keep the running statistics of normalizer.py as buffers (obs_norm, return_norm)."""
        super().__init__()
        self.obs_norm = ObservationNormalizer(tuple(obs_shape)) if normalize_obs else None
        self.return_norm = RunningMeanStd() if normalize_returns else None
        self.policy_torso = build_torso(obs_shape, obs_dtype, hidden, nn.Tanh)
        self.value_torso = (
            None  # the value head reads the policy's CNN
            if isinstance(self.policy_torso, NatureConvTorso)
            else build_torso(obs_shape, obs_dtype, hidden, nn.Tanh)
        )
        features = self.policy_torso.out_dim
        head: nn.Module
        self.distribution: type[Categorical | DiagGaussian]
        if num_actions > 0:
            self.logits = nn.Linear(features, num_actions)
            head, self.distribution = self.logits, Categorical
        else:
            gaussian = StateDependentHead if state_dependent else GaussianHead
            self.gaussian = gaussian(features, action_dims, log_std_init)
            head, self.distribution = self.gaussian, DiagGaussian
        self.value = nn.Linear(features, 1)
        self.num_actions = num_actions
        gains = [(self.policy_torso, 2**0.5), (self.value_torso, 2**0.5), (head, 0.01)]
        for module, gain in [*gains, (self.value, 1.0)]:
            for layer in module.modules() if module is not None else ():
                if isinstance(layer, nn.Linear | nn.Conv2d):
                    nn.init.orthogonal_(layer.weight, gain)
                    if layer.bias is not None:  # every layer here has one
                        nn.init.zeros_(layer.bias)

    @property
    def head(self) -> nn.Module:
        return self.logits if self.num_actions > 0 else self.gaussian

    def normalized(self, obs: torch.Tensor) -> torch.Tensor:
        """The observations as the torsos read them (normalized when obs_norm is on)."""
        return obs if self.obs_norm is None else self.obs_norm(obs)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        obs = self.normalized(obs)
        features = self.policy_torso(obs)
        value_features = features if self.value_torso is None else self.value_torso(obs)
        return self.head(features).float(), self.value(value_features).squeeze(-1).float()

    def policy(self, obs: torch.Tensor) -> torch.Tensor:
        """The policy's output alone, logits or the Gaussian's mean and log-std (acting needs
        no value: half the forward pass of the MLPs)."""
        return self.head(self.policy_torso(self.normalized(obs))).float()

    def values(self, obs: torch.Tensor) -> torch.Tensor:
        """V(obs) [B] alone (in units of the scaled rewards when return_norm is on)."""
        torso = self.policy_torso if self.value_torso is None else self.value_torso
        return self.value(torso(self.normalized(obs))).squeeze(-1).float()


class ActorCriticPolicy(Policy):
    """actions: how the network's policy output becomes actions (numpy_policies.ActionHead:
    Softmax by default, or ClippedGaussian, clipped to the action bounds)."""

    def __init__(self, net: ActorCriticNetwork, actions: ActionHead | None = None):
        self.net, self.actions = net, actions or Softmax()

    def load(self, arrays: dict[str, np.ndarray]) -> None:
        load_numpy_state(self.net, arrays)

    def head(self, obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return self.net.policy(torch.from_numpy(obs)).numpy()

    def act(self, obs: np.ndarray, exploration: float, rng: np.random.Generator) -> np.ndarray:
        """Evaluation (exploration 0): the most likely action; otherwise a sample."""
        if exploration > 0:
            return self.step(obs, exploration, rng)[0]
        return self.actions.mode(self.head(obs))

    def step(self, obs, exploration, rng):
        """Actors sample the policy and record the log-probabilities (the adder's
        "log_probs"; a Gaussian's unclipped samples too)."""
        return self.actions.sample(self.head(obs), rng)

    def values(self, obs: np.ndarray) -> np.ndarray:
        """V(obs) [B] in the env's reward units (an actor bootstraps a truncated episode's
        last reward with it)."""
        with torch.no_grad():
            values = self.net.values(torch.from_numpy(obs))
            if self.net.return_norm is not None:
                values = values * self.net.return_norm.std()
            return values.numpy()

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

    def update(self, batch, weights, step):
        """learn() on the batch with its rewards scaled by the return statistics its actors'
        version was published with, then the batch folded into the statistics (normalizer.py)."""
        raw, net = batch, self.net
        if net.return_norm is not None:
            batch = {
                name: scaled_rewards(column, net.return_norm)
                if name == "rewards" or name.endswith("/rewards")
                else column
                for name, column in batch.items()
            }
        result = self.learn(batch, weights, step)
        if net.obs_norm is not None:
            obs = raw["observations"][:, :-1]  # the last is the next unroll's first
            net.obs_norm.update(obs.reshape(-1, *obs.shape[2:]))
        if net.return_norm is not None:
            net.return_norm.update(raw["returns"])
        return result

    def learn(self, batch, weights, step) -> tuple[torch.Tensor | None, dict[str, float]]:
        """Learning.update's, on the scaled batch."""
        raise NotImplementedError

    def forward(self, batch: dict[str, torch.Tensor]):
        """policy outputs [T, B, P] (logits, or the Gaussian's mean and log-std), values [T, B]
        and the bootstrap values [B] of a batch of unrolls."""
        obs = batch["observations"]
        b, t1 = obs.shape[:2]
        out, values = self.net(obs.reshape(b * t1, *obs.shape[2:]))
        out = out.reshape(b, t1, -1).transpose(0, 1)
        values = values.reshape(b, t1).transpose(0, 1)
        return out[:-1], values[:-1], values[-1]

    def imitation(self, obs: torch.Tensor):
        """The policy head's output (logits, or a Gaussian's mean and log-std) and its
        distribution: what behaviour cloning trains."""
        return self.net.policy(obs), self.net.distribution

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
