"""PPO's builder (Schulman et al. 2017): the learner trains on fresh batches of unrolls, all
acted by its current version, and publishes a version after every update; each actor acts
one unroll per version and then waits for the next.

A2C is the case epochs = 1, minibatches = 1, clip_range = 0 (unclipped: at ratio 1 the
gradient of ratio * A is that of log pi * A). PPO's adaptive KL penalty (Schulman et al. 2017,
section 4) is kl_target > 0, with the clip or without it (clip_range 0).
"""

import dataclasses
from dataclasses import dataclass

from apexrl.algorithms.base import ParameterSync
from apexrl.algorithms.envs import is_atari
from apexrl.algorithms.on_policy import PENDULUM, OnPolicyBuilder, OnPolicySettings
from apexrl.algorithms.tables import TABLE
from apexrl.config import option
from apexrl.schedules import Schedule

KL_COEF_RANGE = (1e-4, 10.0)  # the adaptive coefficient's bounds
# CleanRL's ppo_atari: 10M env steps in batches of 8 envs x 128 steps, the learning rate decayed
# linearly to 0 over those 9,765 batches (one update each here).
ATARI_ENVS, ATARI_UNROLL = 8, 128
ATARI_UPDATES = 10_000_000 // (ATARI_ENVS * ATARI_UNROLL)


@dataclass
class Settings(OnPolicySettings):
    """[ppo]: PPO's settings (Stable-Baselines3's defaults)."""

    gae_lambda: float = option(0.95, "lambda of generalized advantage estimation")
    normalize_advantages: bool = option(
        True, "advantages scaled to mean 0, std 1 per minibatch (as SB3)"
    )
    clip_range: float = option(
        0.2, "the ratio clip epsilon; 0 = unclipped (epochs 1: A2C)", schedule="updates"
    )
    epochs: int = option(10, "passes over each fresh batch")
    minibatches: int = option(4, "minibatches per epoch")
    kl_target: float = option(
        0.0,
        "the KL penalty's target KL(pi_old || pi) per update (0: no penalty): the coefficient"
        " doubles when an update ends above 1.5x it and halves below it / 1.5, and an update"
        " stops its epochs at a minibatch past 4x it",
    )
    kl_coef: float = option(0.5, "the KL penalty's first coefficient (kept within [1e-4, 10])")
    sde_sample_freq: int = option(
        0,
        "gSDE on Box actions (SB3's use_sde): the Gaussian's noise is the policy features times a"
        " learned-scale random matrix, drawn again every this many steps of an env and at each"
        " episode's start (0: off, a plain Gaussian; vector observations only)",
    )


class PPOBuilder(OnPolicyBuilder):
    name = "ppo"
    Settings = Settings
    learning_class = "apexrl.algorithms.ppo.learning:PPOLearning"
    metrics = dataclasses.replace(
        OnPolicyBuilder.metrics,
        figures={
            **OnPolicyBuilder.metrics.figures,
            "approx_kl": "Approximate KL(pi_old || pi) of the last minibatch.",
            "clip_fraction": "Fraction of the last minibatch's ratios outside the clip range.",
            "kl_coef": "The KL penalty's coefficient for the next update (0: no penalty).",
        },
    )

    @property
    def parameter_sync(self) -> ParameterSync:
        """Each unroll acted by a newer version than the last: an actor waits for the next one
        1 s per 256 steps of its unrolls, at least 1 s (then acts again on the old one, should
        the learner lack unrolls of it). A longer batch keeps the learner longer, and an unroll
        acted on the old version while it trains is dropped: at 1 s, Pendulum's actors (1024
        steps) acted about twice the steps the learner used."""
        wait = max(1.0, self.settings.unroll_length / 256)
        return ParameterSync(periodic=False, newer_each_item=True, wait_seconds=wait)

    @classmethod
    def presets(cls, env_id: str) -> dict:
        """rl-baselines3-zoo's CartPole PPO (20 epochs of one minibatch, GAE lambda 0.8, no
        entropy bonus, gradient norm 0.5) at Adam 2e-3; its gamma 0.98 and linear decays are
        not copied. The evaluator, at nice 10, plays on the CPU that the learner and the actors
        leave idle while they take turns. Pendulum-v1: the zoo's ppo settings for it
        (OnPolicyBuilder.pendulum: 10 epochs of 64 minibatches over 4 x 1024 steps, GAE lambda
        0.95, gSDE drawn every 4 steps). docs/benchmarks.md and docs/algorithms.md (gSDE) have
        the figures. Atari: CleanRL's ppo_atari (cls.atari)."""
        if is_atari(env_id):
            return cls.atari(env_id)
        if env_id == PENDULUM:
            presets = cls.pendulum({})
            presets["ppo"] = {
                "unroll_length": 1024,
                "epochs": 10,
                "minibatches": 64,
                "gae_lambda": 0.95,
                "entropy_cost": 0.0,
                "sde_sample_freq": 4,
            }
            return presets
        presets = cls.small_machine(env_id, {"max_grad_norm": 0.5})
        presets["ppo"] = {"epochs": 20, "minibatches": 1, "gae_lambda": 0.8, "entropy_cost": 0.0}
        presets.setdefault("evaluator", {})["nice"] = 10
        return presets

    @classmethod
    def atari(cls, env_id: str) -> dict:
        """CleanRL's ppo_atari (Huang et al. 2022, "The 37 Implementation Details of PPO"): 8
        envs x 128 steps a batch, which local mode's 2 actors x 4 envs give as 8 unrolls of 128
        steps an update; 4 epochs of 4 minibatches, clip 0.1, GAE lambda 0.95, entropy 0.01,
        value 0.5, gradient norm 0.5, advantages normalized per minibatch, Adam (epsilon 1e-5)
        at 2.5e-4 decayed linearly to 0 over 10M env steps. Not copied: its clipped value loss
        (ppo's is SB3's unclipped one) and its end of an episode at each life lost."""
        rate = Schedule("linear", ((0.0, 2.5e-4), (float(ATARI_UPDATES), 0.0)))
        learner = {"batch_size": ATARI_ENVS, "learning_rate": rate, "max_grad_norm": 0.5}
        presets = cls.small_machine(env_id, learner)
        presets["actor"] = {"num_envs": ATARI_ENVS // 2}  # each of local mode's 2 actors
        presets["ppo"] = {
            "unroll_length": ATARI_UNROLL,
            "epochs": 4,
            "minibatches": 4,
            "clip_range": 0.1,
            "gae_lambda": 0.95,
            "entropy_cost": 0.01,
            "value_cost": 0.5,
            "normalize_advantages": True,
            "optimizer": "adam",
            "optimizer_eps": 1e-5,
        }
        presets.setdefault("evaluator", {})["nice"] = 10
        return presets

    def check(self) -> None:
        super().check()
        for name in ("epochs", "minibatches"):
            if getattr(self.settings, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self.settings, name)}")
        s = self.settings
        if not s.clip_range >= 0:  # NaN fails too
            raise ValueError(f"clip_range: must be >= 0 (0: unclipped), got {s.clip_range}")
        if not s.kl_target >= 0:  # NaN fails too
            raise ValueError(f"kl_target: must be >= 0 (0: no KL penalty), got {s.kl_target}")
        if s.kl_target > 0 and not KL_COEF_RANGE[0] <= s.kl_coef <= KL_COEF_RANGE[1]:
            raise ValueError(f"kl_coef: must be in {list(KL_COEF_RANGE)}, got {s.kl_coef}")
        self.check_sde()

    def check_sde(self) -> None:
        """gSDE needs a Gaussian policy acting in numpy (vector observations)."""
        freq, spec = self.settings.sde_sample_freq, self.spec
        if freq < 0:
            raise ValueError(f"sde_sample_freq: must be >= 0 (0: off), got {freq}")
        if freq > 0 and spec.discrete:
            raise ValueError(
                f"sde_sample_freq: gSDE explores Box actions; {spec.env_id} has a Discrete action"
                " space (leave it at 0)"
            )
        if freq > 0 and not spec.vector_obs:
            raise ValueError(
                f"sde_sample_freq: gSDE acts on vector observations; {spec.env_id} has"
                f" {spec.obs_shape} (leave it at 0)"
            )

    def network_options(self) -> dict:
        return super().network_options() | {"state_dependent": self.settings.sde_sample_freq > 0}

    def action_head(self):
        """The plain Gaussian's, or gSDE's (numpy_policies.StateDependentGaussian)."""
        freq, spec = self.settings.sde_sample_freq, self.spec
        if freq == 0:
            return super().action_head()
        from apexrl.algorithms.numpy_policies import StateDependentGaussian

        return StateDependentGaussian(spec.action_low, spec.action_high, freq)

    def dataset(self):
        from apexrl.algorithms.datasets import FreshQueue

        return FreshQueue(TABLE)
