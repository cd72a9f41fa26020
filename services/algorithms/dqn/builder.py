"""Ape-X DQN's builder: double DQN with a dueling network on n-step transitions from one
prioritized table, epsilon-greedy actors on a ladder (Horgan et al. 2018); noisy heads and
C51's distributional head as settings; `rainbow`, the same builder with both on (Hessel et al.
2018)."""

from dataclasses import dataclass

import numpy as np

from apexrl.algorithms.base import EPSILON, MetricNames, hidden_sizes
from apexrl.algorithms.columns import Column
from apexrl.algorithms.envs import is_atari
from apexrl.algorithms.exploration import epsilon_ladder
from apexrl.algorithms.off_policy import SMALL_MACHINE, OffPolicyBuilder, OffPolicySettings
from apexrl.algorithms.tables import redefault
from apexrl.config import option


@dataclass
class Settings(OffPolicySettings):
    """[dqn]: Ape-X DQN's settings."""

    noisy: bool = option(
        False, "noisy value and advantage layers (factorised Gaussian) explore instead of epsilon"
    )
    sigma0: float = option(0.5, "noisy layers' initial noise: sigma = sigma0 / sqrt(inputs)")
    distributional: bool = option(False, "C51: learn the return's distribution over atoms")
    atoms: int = option(51, "C51: atoms of the return distribution")
    v_min: float = option(-10.0, "C51: the lowest atom's return")
    v_max: float = option(10.0, "C51: the highest atom's return")
    adam_epsilon: float = option(1e-8, "Adam's epsilon (the denominator's floor)")


@dataclass
class RainbowSettings(Settings):
    """[rainbow]: dqn's settings with Rainbow's choices (noisy, C51, priority exponent 0.5)."""

    noisy: bool = option(True, Settings.__dataclass_fields__["noisy"].metadata["help"])
    distributional: bool = option(
        True, Settings.__dataclass_fields__["distributional"].metadata["help"]
    )
    priority_exponent: float = redefault(OffPolicySettings, "priority_exponent", 0.5)
    # Rainbow's (Hessel et al. 2018, Table 1; Dopamine's C51 takes 0.01 / 32): at torch's 1e-8,
    # C51's small cross-entropy gradients get full-size Adam steps.
    adam_epsilon: float = option(
        1.5e-4, Settings.__dataclass_fields__["adam_epsilon"].metadata["help"]
    )


class DQNBuilder(OffPolicyBuilder):
    name = "dqn"
    Settings = Settings
    metrics = MetricNames(
        *EPSILON,
        loss_help="Importance-weighted loss of the last update: Huber TD, or C51's cross-entropy.",
        figures={"q_mean": "Mean Q(s, a) of the last batch."},
    )

    @classmethod
    def presets(cls, env_id: str) -> dict:
        if not is_atari(env_id):
            return {"dqn": SMALL_MACHINE}
        # CleanRL's DQN Atari learner (Adam 1e-4, batch 32, the target synced every 1,000 env
        # steps of its single actor, i.e. 250 of its updates), updates in bfloat16 where the
        # hardware has it, 2 replays per transition so the actors keep pace with a CPU learner;
        # a lost life ends the returns as in CleanRL's and Nature DQN's training (Breakout).
        return {
            "dqn": {
                **SMALL_MACHINE,
                "min_size_to_sample": 2_000,
                "samples_per_insert": 2.0,
                "error_buffer": 4_000.0,
                "target_update_interval": 250,
            },
            "learner": {"batch_size": 32, "learning_rate": 1e-4, "precision": "auto"},
            "actor": {"life_loss_terminal": True},
        }

    def check(self) -> None:
        super().check()
        if not self.spec.discrete:
            raise ValueError(
                f"algorithm: {self.name} needs a Discrete action space, {self.spec.env_id} has a"
                " continuous one (use algorithm = dpg)"
            )
        s = self.settings
        if s.sigma0 <= 0:
            raise ValueError(f"sigma0: must be > 0, got {s.sigma0}")
        if s.atoms < 2:
            raise ValueError(f"atoms: must be >= 2, got {s.atoms}")
        if not s.v_min < s.v_max:
            raise ValueError(f"v_min: must be < v_max, got v_min {s.v_min}, v_max {s.v_max}")
        if s.adam_epsilon <= 0:
            raise ValueError(f"adam_epsilon: must be > 0, got {s.adam_epsilon}")

    def columns(self) -> list[Column]:
        """n-step transitions whose actions are int64 indices."""
        return self.item_columns(np.dtype(np.int64))

    def exploration(self, index: int, count: int) -> float:
        """The Ape-X epsilon ladder; with noisy layers it is off (epsilon 0 on every actor):
        the actors explore through a new noise sample each step, as Fortunato et al. and
        Rainbow act."""
        epsilon = epsilon_ladder(index, count)
        return 0.0 if self.settings.noisy else epsilon

    def network(self):
        from apexrl.algorithms.dqn.networks import build_network

        spec, s = self.spec, self.settings
        return build_network(
            spec.obs_shape,
            spec.obs_dtype,
            spec.num_actions,
            hidden_sizes(self.config.hidden),
            sigma0=s.sigma0 if s.noisy else None,
            atoms=s.atoms if s.distributional else 0,
            v_min=s.v_min,
            v_max=s.v_max,
        )

    def policy(self):
        """In numpy for a plain MLP (no torch in the actor: algorithms/numpy_policies.py)."""
        s = self.settings
        if self.spec.vector_obs and not s.noisy and not s.distributional:
            from apexrl.algorithms.numpy_policies import MLPQPolicy

            return MLPQPolicy(self.spec.num_actions, len(hidden_sizes(self.config.hidden)))
        from apexrl.algorithms.dqn.acting import DQNPolicy

        return DQNPolicy(self.network())

    def learning(self, config, device):
        from apexrl.algorithms.dqn.learning import DQNLearning

        return DQNLearning(self.network, config, self.settings, device)


class RainbowBuilder(DQNBuilder):
    """dqn with noisy heads, C51 and a priority exponent of 0.5 by default (its own [rainbow]
    table); on classic-control envs the atoms span [-100, 100], the returns of rewards of
    magnitude 1 discounted by 0.99; on Atari Rainbow's [-10, 10] over clipped rewards, and C51's
    published learning rate, 2.5e-4 (Bellemare et al. 2017; CleanRL's c51_atari), which learns
    Pong faster than dqn's 1e-4 (docs/experiments/atari-value-based.md)."""

    name = "rainbow"
    Settings = RainbowSettings

    @classmethod
    def presets(cls, env_id: str) -> dict:
        presets = DQNBuilder.presets(env_id)
        own = presets.pop("dqn")
        if not is_atari(env_id):
            own = {**own, "v_min": -100.0, "v_max": 100.0}
        else:
            presets["learner"] = {**presets["learner"], "learning_rate": 2.5e-4}
        return {**presets, "rainbow": own}
