"""IMPALA (Espeholt et al. 2018): actors sample their policy into unrolls, the learner trains
on them in the order they come, whatever version acted, with V-trace correcting the lag.

`passes` > 1 reuses each batch as RLlib's APPO does: V-trace's targets and advantages are
computed once, from the learner's policy before the batch's first step, then the learner takes
`passes` gradient steps on them with PPO's clipped surrogate (`clip_range`, the ratio to that
policy). V-trace corrects the actors' lag, the clip the learner's own drift within the batch.
Unclipped passes with V-trace recomputed each step (stop 21) diverged: at 4 passes half the
Acrobot-v1 seeds went unsolved in 60 s. Local mode takes 2 passes, and on Acrobot-v1 20 with
ppo's other settings (lambda 0.8, normalized advantages, gradient norm 0.5, no entropy bonus):
local.py's ENV_DEFAULTS and README, Time to solve, say why.
"""

import torch

from apexrl.algorithms.actor_critic import UnrollAlgorithm, UnrollLearning
from apexrl.algorithms.impala.vtrace import impala_loss, vtrace


class IMPALALearning(UnrollLearning):
    def __init__(self, build, config, device):
        if config.passes < 1:
            raise ValueError(f"passes: must be >= 1, got {config.passes}")
        super().__init__(build, config, device)

    def update(self, batch, weights, step):
        config = self.config
        logits, values, bootstrap = self.forward(batch)
        actions = self.time_major(batch, "actions")
        log_pi = torch.log_softmax(logits, -1).gather(-1, actions.unsqueeze(-1)).squeeze(-1)
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
                logits, actions, values, targets, config.value_cost, config.entropy_cost,
                start, clip, config.normalize_advantages,
            )  # fmt: skip
            self.step(loss)
        figures = {k: float(v) for k, v in figures.items()}
        return torch.zeros(len(actions[0])), figures | {"q_mean": float(values.detach().mean())}


class IMPALA(UnrollAlgorithm):
    name = "impala"
    learning_class = IMPALALearning
