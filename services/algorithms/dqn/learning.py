"""Ape-X DQN's learning (double DQN, dueling network, n-step; expected Q or C51's
distribution); its policy is in acting.py."""

import functools

import torch

from apexrl.algorithms.base import Learning
from apexrl.algorithms.dqn.losses import loss_of
from apexrl.algorithms.dqn.networks import set_noise
from apexrl.algorithms.networks import TargetNetworkLearning, adam
from apexrl.algorithms.ppo.losses import Categorical


class DQNLearning(TargetNetworkLearning, Learning):
    def __init__(self, build, config, settings, device: torch.device):
        super().__init__(build, config, settings, device)
        self.loss = loss_of(self.online)

    @functools.cached_property
    def optimizer(self) -> torch.optim.Adam:
        return adam(
            self.online.parameters(), self.config.learning_rate, eps=self.settings.adam_epsilon
        )

    def imitation(self, obs):
        """The Q-values as a softmax policy's logits: behaviour cloning's cross-entropy on them
        makes the greedy action the demonstrated one (learner/pretraining.py says why not
        DQfD's margin loss)."""
        return self.online(obs), Categorical

    def update(self, batch, weights, step):
        # Independent noise for the online and target networks at every update (Rainbow).
        set_noise(self.online)
        set_noise(self.target)
        loss, priorities, q = self.loss(self.online, self.target, batch, weights)
        self.step(loss, step)
        return priorities, {"loss": loss.item(), "q_mean": q.mean().item()}
