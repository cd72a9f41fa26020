"""R2D2's learning (burn-in, n-step double Q on rescaled values, mixed sequence priorities);
its policy is in acting.py."""

from apexrl.algorithms.base import Learning
from apexrl.algorithms.networks import TargetNetworkLearning
from apexrl.algorithms.r2d2.losses import r2d2_loss


class R2D2Learning(TargetNetworkLearning, Learning):
    def update(self, batch, weights, step):
        s = self.settings
        loss, priorities, q_mean = r2d2_loss(
            self.online, self.target, batch, weights, s.burn_in, s.n_step, s.priority_eta
        )
        self.step(loss, step)
        return priorities, {"loss": loss.item(), "q_mean": q_mean.item()}
