"""Behaviour cloning: before its first parameter version, the learner trains the policy to take
the demonstrations' actions on their observations (the pretrain_ settings;
docs/demonstrations.md#behaviour-cloning), so that on-policy actors start from the expert.

The loss is the negative log-likelihood of the demonstrated actions under the policy the
algorithm's Learning.imitation exposes: cross-entropy on a softmax policy's logits, a
Gaussian's negative log-likelihood on Box actions, and for a Q-network cross-entropy on its
Q-values taken as logits. DQfD pretrains with a large-margin loss beside its TD losses; the
cross-entropy has no margin to tune and makes the greedy action the demonstrated one as well
(the Q-values it leaves are scores, not returns: the TD updates that follow make them returns).
A fresh Adam of its own: the algorithm's optimizer state starts untouched.
"""

import math

import numpy as np
import torch

from apexrl.algorithms import demonstrations
from apexrl.algorithms.base import Learning
from apexrl.algorithms.envs import EnvSpec
from apexrl.config import LearnerConfig

# Pairs per forward pass when the final loss and accuracy are measured over all of them.
CHUNK = 4096


def demonstration_pairs(
    config: LearnerConfig, spec: EnvSpec
) -> tuple[np.ndarray, np.ndarray] | None:
    """(observations, actions) of the pretrain_demonstrations folder, checked against the env
    (ValueError naming the setting and the file); None when behaviour cloning is off."""
    if not config.pretrain_demonstrations:
        return None
    return demonstrations.pairs(config.pretrain_demonstrations, spec)


def clone(
    learning: Learning,
    observations: np.ndarray,
    actions: np.ndarray,
    config: LearnerConfig,
    device: torch.device,
) -> dict[str, float]:
    """pretrain_steps Adam steps on minibatches of pretrain_batch_size pairs drawn uniformly;
    then Learning.cloned(). Returns the final loss and accuracy over every pair (accuracy: the
    share whose most likely action is the demonstrated one; NaN for Box actions)."""
    parameters = [
        parameter
        for optimizer in learning.optimizers()
        for group in optimizer.param_groups
        for parameter in group["params"]
    ]
    optimizer = torch.optim.Adam(parameters, lr=config.pretrain_learning_rate)
    obs = torch.as_tensor(observations, device=device)
    taken = torch.as_tensor(actions, device=device)
    draws = torch.Generator().manual_seed(config.seed)
    for _ in range(config.pretrain_steps):
        index = torch.randint(len(obs), (config.pretrain_batch_size,), generator=draws)
        index = index.to(device)
        loss = negative_log_likelihood(learning, obs[index], taken[index]).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    learning.cloned()
    return measure(learning, obs, taken)


def negative_log_likelihood(
    learning: Learning, obs: torch.Tensor, actions: torch.Tensor
) -> torch.Tensor:
    """-log pi(a | s) [B] of the demonstrated actions under the policy."""
    out, distribution = learning.imitation(obs)
    return -distribution.evaluate(out, actions)[0]


def measure(learning: Learning, obs: torch.Tensor, actions: torch.Tensor) -> dict[str, float]:
    """The mean loss over all pairs and the accuracy (NaN for continuous actions)."""
    total = correct = 0.0
    discrete = not actions.dtype.is_floating_point
    with torch.no_grad():
        for start in range(0, len(obs), CHUNK):
            part, taken = obs[start : start + CHUNK], actions[start : start + CHUNK]
            out, distribution = learning.imitation(part)
            total += float(-distribution.evaluate(out, taken)[0].sum())
            if discrete:
                correct += float((out.argmax(-1) == taken).sum())
    return {"loss": total / len(obs), "accuracy": correct / len(obs) if discrete else math.nan}
