"""UNREAL's update: impala's on the batch of unrolls, plus each auxiliary task's weighted loss
on the replayed batches the learner joins to it ("experience/..." and "rewards/..." columns,
builder.py), in the same gradient step."""

import torch

from apexrl.algorithms.impala.learning import IMPALALearning
from apexrl.algorithms.unreal.builder import EXPERIENCE, REWARDS
from apexrl.algorithms.unreal.losses import (
    pixel_control_loss,
    reward_prediction_loss,
    value_replay_loss,
)
from apexrl.algorithms.unreal.networks import UNREALNetwork

TASKS = ("pc", "rp", "vr")


class UNREALLearning(IMPALALearning):
    net: UNREALNetwork

    def auxiliary(self, batch):
        losses = self.auxiliary_losses(batch)
        weights = {task: getattr(self.settings, f"{task}_lambda") for task in TASKS}
        total = sum(weights[task] * loss for task, loss in losses.items())
        zero = torch.zeros(())
        figures = {f"{task}_loss": losses.get(task, zero).detach() for task in TASKS}
        return total, figures

    def auxiliary_losses(self, batch) -> dict[str, torch.Tensor]:
        """The unweighted loss of each task that is on, by task."""
        s, net, losses = self.settings, self.net, {}
        if s.pc_lambda > 0 or s.vr_lambda > 0:
            obs = batch[f"{EXPERIENCE}/observations"]  # [B, T + 1, *obs]
            b, t1 = obs.shape[:2]
            flat = obs.reshape(b * t1, *obs.shape[2:])
            discounts = batch[f"{EXPERIENCE}/discounts"].T
            if s.vr_lambda > 0:
                values = net.values(flat).reshape(b, t1).T
                rewards = batch[f"{EXPERIENCE}/rewards"].T
                losses["vr"] = value_replay_loss(values, rewards, discounts)
            if s.pc_lambda > 0:
                q = net.pixel_q(flat)
                q = q.reshape(b, t1, *q.shape[1:]).transpose(0, 1)
                frames = obs[:, :, -1].transpose(0, 1)  # the newest frame of each stack
                actions = batch[f"{EXPERIENCE}/actions"].T
                losses["pc"] = pixel_control_loss(q, actions, frames, discounts, s.pc_gamma)
        if s.rp_lambda > 0:
            logits = net.reward_logits(batch[f"{REWARDS}/observations"])
            rewards = batch[f"{REWARDS}/reward"]
            losses["rp"] = reward_prediction_loss(logits, rewards, s.reward_threshold)
        return losses
