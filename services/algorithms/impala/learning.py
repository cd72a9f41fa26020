"""IMPALA's update: V-trace targets, then one step of the published loss, or `passes` clipped
steps (builder.py says why)."""

import torch

from apexrl.algorithms.actor_critic import UnrollLearning
from apexrl.algorithms.impala.vtrace import impala_loss, vtrace


class IMPALALearning(UnrollLearning):
    def learn(self, batch, weights, step):
        config, distribution = self.settings, self.net.distribution
        logits, values, bootstrap = self.forward(batch)
        actions = self.time_major(batch, "actions")
        log_pi = distribution.evaluate(logits, actions)[0]
        targets = vtrace(
            self.time_major(batch, "log_probs"),
            log_pi,
            self.time_major(batch, "rewards"),
            self.time_major(batch, "discounts"),
            values.detach(),
            bootstrap.detach(),
            lam=config.gae_lambda,
        )
        # One pass: the published loss. More: APPO's, against the policy the targets came from.
        start = log_pi.detach() if config.passes > 1 else None
        clip = config.clip_range if config.clip_range > 0 else None
        for i in range(config.passes):
            if i:
                logits, values, _ = self.forward(batch)
            loss, figures = impala_loss(
                logits,
                actions,
                values,
                targets,
                config.value_cost,
                config.entropy_cost,
                start,
                clip,
                config.normalize_advantages,
                distribution=distribution,
            )
            extra, extra_figures = self.auxiliary(batch)
            figures |= extra_figures | {"loss": (loss + extra).detach()}
            self.step(loss + extra)
        figures = {k: float(v) for k, v in figures.items()}
        return None, figures | {"value_mean": float(values.detach().mean())}

    def auxiliary(self, batch) -> tuple[torch.Tensor | float, dict[str, torch.Tensor]]:
        """Losses added to each pass's, and their figures (none here)."""
        return 0.0, {}
