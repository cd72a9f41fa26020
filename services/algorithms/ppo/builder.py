"""PPO's builder (Schulman et al. 2017): the learner trains on fresh batches of unrolls, all
acted by its current version, and publishes a version after every update; each actor acts
one unroll per version and then waits for the next.

A2C is the case epochs = 1, minibatches = 1, clip_range = 0 (unclipped: at ratio 1 the
gradient of ratio * A is that of log pi * A).
"""

from dataclasses import dataclass

from apexrl.algorithms.base import ParameterSync
from apexrl.algorithms.on_policy import TABLE, OnPolicyBuilder, OnPolicySettings
from apexrl.config import option


@dataclass
class Settings(OnPolicySettings):
    """[ppo]: PPO's settings (Stable-Baselines3's defaults)."""

    gae_lambda: float = option(0.95, "lambda of generalized advantage estimation")
    normalize_advantages: bool = option(
        True, "advantages scaled to mean 0, std 1 per minibatch (as SB3)"
    )
    clip_range: float = option(0.2, "the ratio clip epsilon; 0 = unclipped (epochs 1: A2C)")
    epochs: int = option(10, "passes over each fresh batch")
    minibatches: int = option(4, "minibatches per epoch")


class PPOBuilder(OnPolicyBuilder):
    name = "ppo"
    Settings = Settings
    parameter_sync = ParameterSync(periodic=False, newer_each_item=True)
    learning_class = "apexrl.algorithms.ppo.learning:PPOLearning"
    figures = {
        **OnPolicyBuilder.figures,
        "approx_kl": "Approximate KL(pi_old || pi) of the last minibatch.",
        "clip_fraction": "Fraction of the last minibatch's ratios outside the clip range.",
    }

    @classmethod
    def presets(cls, env_id: str) -> dict:
        """rl-baselines3-zoo's CartPole PPO (20 epochs of one minibatch, GAE lambda 0.8, no
        entropy bonus, gradient norm 0.5) at Adam 2e-3; its gamma 0.98 and linear decays are
        not copied. The evaluator, at nice 10, plays on the CPU that the learner and the actors
        leave idle while they take turns. docs/benchmarks.md has the figures."""
        presets = cls.small_machine(env_id, {"max_grad_norm": 0.5})
        presets["ppo"] = {"epochs": 20, "minibatches": 1, "gae_lambda": 0.8, "entropy_cost": 0.0}
        presets.setdefault("evaluator", {})["nice"] = 10
        return presets

    def check(self) -> None:
        super().check()
        for name in ("epochs", "minibatches"):
            if getattr(self.settings, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self.settings, name)}")

    def dataset(self):
        from apexrl.algorithms.datasets import FreshQueue

        return FreshQueue(TABLE)
