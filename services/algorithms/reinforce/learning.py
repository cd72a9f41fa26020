"""REINFORCE's update: one gradient step on a batch of whole episodes, all acted by the
learner's current version (builder.py; the returns and the loss: losses.py)."""

import torch

from apexrl.algorithms.actor_critic import UnrollLearning
from apexrl.algorithms.reinforce.losses import discounted_returns, reinforce_loss


class REINFORCELearning(UnrollLearning):
    """The actor-critic network of impala and ppo; without a baseline its value head is
    neither evaluated nor trained."""

    def update(self, batch, weights, step):
        settings = self.settings
        # The padding after the batch's longest item is cut off: nothing there to learn from.
        length = int(batch["mask"].sum(1).max())
        mask = batch["mask"][:, :length]
        obs = batch["observations"][:, : length + 1]
        b = len(obs)
        flat = obs.reshape(b * (length + 1), *obs.shape[2:])
        baseline = settings.baseline == "value"
        if baseline:
            logits, values = self.net(flat)
            values = values.reshape(b, length + 1)
        else:
            logits, values = self.net.policy(flat), None
        logits = logits.reshape(b, length + 1, -1)[:, :-1]
        lengths = mask.sum(1).long()
        if baseline:  # V of the observation after each item's last real step
            bootstrap = values.detach()[torch.arange(b, device=obs.device), lengths]
        else:
            bootstrap = torch.zeros(b, device=obs.device)
        returns = discounted_returns(
            batch["rewards"][:, :length], batch["discounts"][:, :length], mask, bootstrap
        )
        loss, figures = reinforce_loss(
            logits,
            batch["actions"][:, :length],
            returns,
            mask,
            values[:, :-1] if baseline else None,
            value_cost=settings.value_cost,
            entropy_cost=settings.entropy_cost,
            normalize=settings.normalize,
        )
        self.step(loss)
        value_mean = float((values.detach()[:, :-1] * mask).sum() / mask.sum()) if baseline else 0.0
        figures = {k: float(v) for k, v in figures.items()}
        return None, figures | {
            "value_mean": value_mean,
            "episode_steps": float(lengths.float().mean()),
        }
