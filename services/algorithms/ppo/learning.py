"""PPO's update: `epochs` passes of `minibatches` clipped-objective steps over a fresh batch of
unrolls, with GAE advantages (builder.py says how the batch is made); with kl_target > 0 the
adaptive KL penalty too, the behaviour policy being the learner's own network before the
update (the batch was acted by that version: FreshQueue)."""

import torch

from apexrl.algorithms.actor_critic import UnrollLearning
from apexrl.algorithms.ppo.builder import KL_COEF_RANGE
from apexrl.algorithms.ppo.losses import adapted_kl_coef, gae, ppo_loss


class PPOLearning(UnrollLearning):
    def __init__(self, build, config, settings, device: torch.device):
        super().__init__(build, config, settings, device)
        self.kl_coef = settings.kl_coef if settings.kl_target > 0 else 0.0

    def learn(self, batch, weights, step):
        config = self.settings
        with torch.no_grad():
            old_logits, values, bootstrap = self.forward(batch)
        rewards, discounts = self.time_major(batch, "rewards"), self.time_major(batch, "discounts")
        advantages, returns = gae(rewards, discounts, values, bootstrap, config.gae_lambda)
        obs = batch["observations"][:, :-1].transpose(0, 1)  # [T, B, *obs]
        flat = {
            "obs": obs.reshape(-1, *obs.shape[2:]),
            "actions": self.time_major(batch, "actions").flatten(0, 1),
            "log_probs": self.time_major(batch, "log_probs").reshape(-1),
            "advantages": advantages.reshape(-1),
            "returns": returns.reshape(-1),
        }
        penalized, distribution = config.kl_target > 0, self.net.distribution
        if penalized:
            flat["old_logits"] = old_logits.reshape(-1, old_logits.shape[-1])
        n = len(flat["actions"])
        clip = config.clip_range if config.clip_range > 0 else None
        too_far = False  # the KL penalty's early stop
        for _ in range(config.epochs):
            if too_far:
                break
            for index in torch.randperm(n, device=obs.device).chunk(config.minibatches):
                logits, new_values = self.net(flat["obs"][index])
                loss, figures = ppo_loss(
                    logits,
                    flat["actions"][index],
                    flat["log_probs"][index],
                    flat["advantages"][index],
                    new_values,
                    flat["returns"][index],
                    clip_range=clip,
                    vf_coef=config.value_cost,
                    ent_coef=config.entropy_cost,
                    normalize_advantages=config.normalize_advantages,
                    old_logits=flat["old_logits"][index] if penalized else None,
                    kl_coef=self.kl_coef,
                    distribution=distribution,
                )
                too_far = penalized and float(figures["kl"]) > 4 * config.kl_target
                if too_far:  # this policy is far from the batch's already: no more steps
                    break
                self.step(loss)
        if penalized:
            with torch.no_grad():
                logits, _ = self.net(flat["obs"])
                kl = distribution.kl(flat["old_logits"], logits)
            self.kl_coef = adapted_kl_coef(self.kl_coef, float(kl), config.kl_target, KL_COEF_RANGE)
        figures = {k: float(v) for k, v in figures.items() if k != "kl"}
        figures["kl_coef"] = self.kl_coef
        return None, figures | {"value_mean": float(values.mean())}

    def state(self) -> tuple[dict, dict]:
        arrays, meta = super().state()
        return arrays, meta | {"kl_coef": self.kl_coef}

    def load_state(self, arrays: dict, meta: dict) -> None:
        super().load_state(arrays, meta)
        self.kl_coef = meta.get("kl_coef", self.kl_coef)
