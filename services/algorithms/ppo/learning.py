"""PPO's update: `epochs` passes of `minibatches` clipped-objective steps over a fresh batch of
unrolls, with GAE advantages (builder.py says how the batch is made)."""

import torch

from apexrl.algorithms.actor_critic import UnrollLearning
from apexrl.algorithms.ppo.losses import gae, ppo_loss


class PPOLearning(UnrollLearning):
    def update(self, batch, weights, step):
        config = self.settings
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
        return None, figures | {"value_mean": float(values.mean())}
