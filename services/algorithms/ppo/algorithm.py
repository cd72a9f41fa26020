"""PPO (Schulman et al. 2017): the learner takes a fresh batch of unrolls, all acted by its
current version, makes `epochs` passes of `minibatches` clipped-objective steps over it with
GAE advantages, then publishes the next version; older unrolls are dropped (counted).

A2C is the case epochs = 1, minibatches = 1, clip_range = 0 (unclipped: at ratio 1 the
gradient of ratio * A is that of log pi * A).
"""

import torch

from apexrl.algorithms.actor_critic import UnrollAlgorithm, UnrollLearning
from apexrl.algorithms.ppo.losses import gae, ppo_loss


class PPOLearning(UnrollLearning):
    def update(self, batch, weights, step):
        config = self.config
        with torch.no_grad():
            _, values, bootstrap = self.forward(batch)
        rewards, discounts = self.time_major(batch, "rewards"), self.time_major(batch, "discounts")
        advantages, returns = gae(rewards, discounts, values, bootstrap, config.gae_lambda)
        obs = batch["observations"][:, :-1].transpose(0, 1)  # [T, B, *obs]
        flat = {
            "obs": obs.reshape(-1, *obs.shape[2:]),
            "actions": self.time_major(batch, "actions").reshape(-1),
            "log_probs": self.time_major(batch, "log_probs").reshape(-1),
            "advantages": advantages.reshape(-1),
            "returns": returns.reshape(-1),
        }
        n = len(flat["actions"])
        clip = config.clip_range if config.clip_range > 0 else None
        for _ in range(config.epochs):
            for index in torch.randperm(n, device=obs.device).chunk(config.minibatches):
                logits, new_values = self.net(flat["obs"][index])
                loss, figures = ppo_loss(
                    logits, flat["actions"][index], flat["log_probs"][index],
                    flat["advantages"][index], new_values, flat["returns"][index],
                    clip_range=clip, vf_coef=config.value_cost, ent_coef=config.entropy_cost,
                    normalize_advantages=config.normalize_advantages,
                )  # fmt: skip
                self.step(loss)
        figures = {k: float(v) for k, v in figures.items()}
        return torch.zeros(batch["actions"].shape[0]), figures | {"q_mean": float(values.mean())}


class PPO(UnrollAlgorithm):
    name = "ppo"
    current_version_only = True
    learning_class = PPOLearning
