"""Double-DQN loss on n-step transitions with prioritized-replay importance weights.

The actor folds n-step bookkeeping into two columns: `reward` is the discounted
n-step return and `discount` is gamma^m * (1 - terminated). So the target is just
y = reward + discount * Q_target(next_obs, argmax_a Q_online(next_obs, a)),
and the learner never needs n or gamma.
"""

import torch
import torch.nn.functional as F
from torch import nn


def td_targets(
    online: nn.Module,
    target: nn.Module,
    reward: torch.Tensor,
    discount: torch.Tensor,
    next_obs: torch.Tensor,
) -> torch.Tensor:
    """Double-DQN targets [B]: online net picks the next action, target net values it."""
    with torch.no_grad():
        next_action = online(next_obs).argmax(dim=1, keepdim=True)
        next_value = target(next_obs).gather(1, next_action).squeeze(1)
        return reward + discount * next_value


def dqn_loss(
    online: nn.Module,
    target: nn.Module,
    batch: dict[str, torch.Tensor],
    weights: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Importance-weighted mean Huber loss, the detached TD errors [B] for new priorities, and
    the detached Q(obs, action) [B] (for metrics).

    batch holds the transition columns obs, action (int64), reward, discount, next_obs.
    """
    y = td_targets(online, target, batch["reward"], batch["discount"], batch["next_obs"])
    q = online(batch["obs"]).gather(1, batch["action"].long().unsqueeze(1)).squeeze(1)
    # Huber with delta 1 per item, then scaled by the importance weights before the mean.
    per_item = F.huber_loss(q, y, reduction="none", delta=1.0)
    loss = (weights * per_item).mean()
    td_errors = (y - q).detach()
    return loss, td_errors, q.detach()
