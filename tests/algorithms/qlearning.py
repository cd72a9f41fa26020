"""One-step Q-learning from a uniform replay table: an algorithm written outside services/, to
show that an algorithm is its builder (run it with `algorithm = "tests.algorithms.qlearning:
QLearningBuilder"`). It reuses the library's n-step adder (n = 1), MLP torso and weight helpers,
and writes its own settings, table, policy and update step."""

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from apexrl.algorithms.adders.nstep import NStepAdder
from apexrl.algorithms.base import Builder, Learning, MetricNames, Policy, prefixed
from apexrl.algorithms.columns import nstep_columns
from apexrl.algorithms.datasets import Stream
from apexrl.algorithms.networks import adam, build_torso, load_numpy_state, state_to_numpy
from apexrl.config import ReplayTableConfig, option

TABLE = "default"


@dataclass
class Settings:
    """[qlearning]: one-step Q-learning's settings."""

    fixed_epsilon: float = option(0.1, "every actor's exploration epsilon (no ladder)")
    target_update_interval: int = option(100, "updates between target network syncs")
    capacity: int = option(50_000, "transitions the uniform table holds")
    min_size_to_sample: int = option(500, "sampling waits until the table holds this many")
    samples_per_insert: float = option(4.0, "rate limiter: samples per inserted transition")


class QNet(nn.Module):
    def __init__(self, obs_shape, obs_dtype, num_actions: int):
        super().__init__()
        self.torso = build_torso(obs_shape, obs_dtype, (64, 64), nn.ReLU)
        self.head = nn.Linear(self.torso.out_dim, num_actions)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.head(self.torso(obs))


class QPolicy(Policy):
    def __init__(self, net: QNet):
        self.net = net

    def load(self, arrays):
        load_numpy_state(self.net, arrays)

    def act(self, obs, exploration, rng):
        with torch.no_grad():
            greedy = self.net(torch.from_numpy(obs)).argmax(1).numpy()
        random = rng.integers(self.net.head.out_features, size=len(obs))
        return np.where(rng.random(len(obs)) < exploration, random, greedy)

    def priorities(self, items):
        return np.ones(len(items["action"]), np.float32)  # a uniform table: unused


class QLearning(Learning):
    def __init__(self, build, config, settings, device):
        self.settings = settings
        self.online, self.target = build().to(device), build().to(device)
        self.target.load_state_dict(self.online.state_dict())
        self.optimizer = adam(self.online.parameters(), config.learning_rate)

    def update(self, batch, weights, step):
        q = self.online(batch["obs"]).gather(1, batch["action"].unsqueeze(1)).squeeze(1)
        with torch.no_grad():
            best_next = self.target(batch["next_obs"]).max(1).values
            target = batch["reward"] + batch["discount"] * best_next
        loss = nn.functional.smooth_l1_loss(q, target)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        if step % self.settings.target_update_interval == 0:
            self.target.load_state_dict(self.online.state_dict())
        return None, {"loss": loss.item(), "q_mean": q.mean().item()}

    def parameters(self):
        return state_to_numpy(self.online)

    def state(self):
        arrays = {f"online/{k}": v for k, v in state_to_numpy(self.online).items()}
        return arrays | {f"target/{k}": v for k, v in state_to_numpy(self.target).items()}, {}

    def load_state(self, arrays, meta):
        load_numpy_state(self.online, prefixed(arrays, "online"))
        load_numpy_state(self.target, prefixed(arrays, "target"))


class QLearningBuilder(Builder):
    name = "qlearning"
    Settings = Settings
    metrics = MetricNames(
        "epsilon",
        "Exploration epsilon (the same for every actor).",
        figures={"q_mean": "Mean Q(s, a) of the last batch."},
    )

    def columns(self):
        return nstep_columns(self.spec, np.dtype(np.int64))

    def tables(self):
        s = self.settings
        return [
            ReplayTableConfig(
                name=TABLE, capacity=s.capacity, sampler="uniform", remover="fifo",
                rate_limiter="ratio", min_size_to_sample=s.min_size_to_sample,
                samples_per_insert=s.samples_per_insert, error_buffer=4 * s.min_size_to_sample,
                signature=",".join(c.spec() for c in self.columns()),
            )
        ]  # fmt: skip

    def exploration(self, index, count):
        return self.settings.fixed_epsilon

    def adders(self, num_envs, policy):
        return [NStepAdder(num_envs, 1, self.config.gamma, table=TABLE)]

    def network(self):
        return QNet(self.spec.obs_shape, self.spec.obs_dtype, self.spec.num_actions)

    def policy(self):
        return QPolicy(self.network())

    def dataset(self):
        return Stream(TABLE, prioritized=False)

    def learning(self, config, device):
        return QLearning(self.network, config, self.settings, device)
