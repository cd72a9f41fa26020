"""Ape-X DPG's builder (Horgan et al. 2018): DDPG's deterministic policy and critic on n-step
transitions from one prioritized table, actors exploring with Gaussian action noise on a
ladder of scales."""

from dataclasses import dataclass

import numpy as np

from apexrl.algorithms.base import MetricNames, hidden_sizes
from apexrl.algorithms.columns import Column
from apexrl.algorithms.exploration import noise_ladder
from apexrl.algorithms.off_policy import SMALL_MACHINE, OffPolicyBuilder, OffPolicySettings
from apexrl.config import option


@dataclass
class Settings(OffPolicySettings):
    """[dpg]: Ape-X DPG's settings (targets: Ape-X DPG copies policy and critic every 100
    batches, DDPG blends them in with target_tau 0.01 every update)."""

    policy_learning_rate: float = option(
        0.0, "the policy's Adam learning rate (0: the learner's learning_rate, as the critic's)"
    )


class DPGBuilder(OffPolicyBuilder):
    name = "dpg"
    Settings = Settings
    metrics = MetricNames(
        exploration="noise_scale",
        exploration_help="Gaussian action-noise std, as a fraction of the action half-range,"
        " from the actor's lease.",
        loss_help="Importance-weighted TD loss (Huber) of the last update.",
        figures={
            "q_mean": "Mean Q(s, a) of the last batch.",
            "policy_loss": "Policy loss (-Q(s, pi(s))) of the last update.",
        },
    )

    @classmethod
    def presets(cls, env_id: str) -> dict:
        return {"dpg": SMALL_MACHINE}

    def check(self) -> None:
        super().check()
        rate = self.settings.policy_learning_rate
        if not rate >= 0:  # NaN fails too
            raise ValueError(f"policy_learning_rate: must be >= 0 (0: learning_rate), got {rate}")
        if self.spec.discrete:
            raise ValueError(
                f"algorithm: dpg needs a continuous (Box) action space, {self.spec.env_id} has"
                f" a Discrete one with {self.spec.num_actions} actions (use algorithm = dqn)"
            )

    def columns(self) -> list[Column]:
        """n-step transitions whose actions are float32 of the env's action shape, inside its
        bounds."""
        return self.item_columns(np.dtype(np.float32))

    def exploration(self, index: int, count: int) -> float:
        return noise_ladder(index, count)

    def networks(self):
        from apexrl.algorithms.dpg.networks import build_actor_critic

        spec = self.spec
        return build_actor_critic(
            spec.obs_shape,
            spec.obs_dtype,
            spec.action_low,
            spec.action_high,
            hidden_sizes(self.config.hidden),
        )

    def policy(self):
        from apexrl.algorithms.dpg.acting import DPGPolicy

        return DPGPolicy(self.networks(), self.spec.action_low, self.spec.action_high)

    def learning(self, config, device):
        from apexrl.algorithms.dpg.learning import DPGLearning

        return DPGLearning(self.networks, config, self.settings, device)
