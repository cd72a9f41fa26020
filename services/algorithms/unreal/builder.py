"""UNREAL's builder (Jaderberg et al. 2016, "Reinforcement Learning with Unsupervised Auxiliary
Tasks"): impala's V-trace actor-critic plus three auxiliary tasks learned off-policy from a
small experience replay that the same actors fill, each switched off by a weight of 0.

- pixel control (`pc_lambda`): n-step Q-learning (gamma `pc_gamma`) of pseudo-rewards, the mean
  absolute change of each 4x4 cell of the 84x84 frame's central 80x80, on a deconvolution head;
- reward prediction (`rp_lambda`): the sign of the reward after 3 consecutive observations
  (zero, positive, negative; |reward| <= `reward_threshold` is zero), from windows drawn half
  rewarding by the replay's `balanced` sampler;
- value replay (`vr_lambda`): the value regressed to n-step returns on replayed sequences.

The base is impala's, not A3C's: actors lag the learner here as A3C's threads lag its shared
weights, and V-trace corrects the lag that A3C ignores. It is feed-forward (impala's network,
the auxiliary heads on the policy torso's features), not the paper's LSTM: the services carry
no recurrent state through the replay yet.

Tables: "default", the queue of unrolls (impala's); "experience", `experience_steps` steps in
sequences of `sequence_length` (uniform, oldest evicted) for pixel control and value replay;
"rewards", that many 3-observation windows (`balanced`) for reward prediction. A table whose
tasks are all off is not declared, filled or read.
"""

import dataclasses
from dataclasses import dataclass

import numpy as np

from apexrl.algorithms.base import Adder, Policy, hidden_sizes, value_function
from apexrl.algorithms.columns import (
    Column,
    compressed_observations,
    stacked_columns,
    unroll_columns,
)
from apexrl.algorithms.envs import is_atari
from apexrl.algorithms.impala.builder import IMPALABuilder
from apexrl.algorithms.impala.builder import Settings as IMPALASettings
from apexrl.algorithms.on_policy import HIDDEN
from apexrl.algorithms.tables import signature
from apexrl.algorithms.unreal.adders import WINDOW, ExperienceAdder, RewardWindowAdder
from apexrl.config import ReplayTableConfig, option

EXPERIENCE, REWARDS = "experience", "rewards"


@dataclass
class Settings(IMPALASettings):
    """[unreal]: impala's settings and the auxiliary tasks' (the paper's where it has them)."""

    pc_lambda: float = option(0.05, "weight of the pixel control loss (0: off)")
    rp_lambda: float = option(1.0, "weight of the reward prediction loss (0: off)")
    vr_lambda: float = option(1.0, "weight of the value replay loss (0: off)")
    pc_gamma: float = option(0.9, "discount of pixel control's n-step Q-learning")
    reward_threshold: float = option(
        0.1, "reward prediction: a reward of |r| above this is non-zero (and marked rewarding)"
    )
    experience_steps: int = option(
        2000, "env steps the experience replay holds (and reward windows the rewards table)"
    )
    sequence_length: int = option(20, "steps in each replayed sequence (pixel control, values)")
    replay_batch: int = option(
        8, "replayed sequences (and reward windows) in each update's auxiliary batches"
    )


class UNREALBuilder(IMPALABuilder):
    name = "unreal"
    Settings = Settings
    learning_class = "apexrl.algorithms.unreal.learning:UNREALLearning"
    metrics = dataclasses.replace(
        IMPALABuilder.metrics,
        figures={
            **IMPALABuilder.metrics.figures,
            "pc_loss": "Pixel control loss of the last update (0: off).",
            "rp_loss": "Reward prediction loss of the last update (0: off).",
            "vr_loss": "Value replay loss of the last update (0: off).",
        },
    )

    @classmethod
    def presets(cls, env_id: str) -> dict:
        """impala's, under [unreal]; pixel control off but on Atari (it needs frames)."""
        presets = super().presets(env_id)
        presets["unreal"] = presets.pop("impala")
        # impala's reward scaling is measured without the auxiliary tasks, which read rewards.
        presets["unreal"].pop("normalize_rewards", None)
        if not is_atari(env_id):
            presets["unreal"]["pc_lambda"] = 0.0
        return presets

    def check(self) -> None:
        super().check()
        s = self.settings
        for name in ("pc_lambda", "rp_lambda", "vr_lambda", "reward_threshold"):
            if not getattr(s, name) >= 0:
                raise ValueError(f"{name}: must be >= 0, got {getattr(s, name)}")
        if not 0 <= s.pc_gamma <= 1:
            raise ValueError(f"pc_gamma: must be in [0, 1], got {s.pc_gamma}")
        for name in ("sequence_length", "replay_batch"):
            if getattr(s, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(s, name)}")
        if s.experience_steps < s.sequence_length:
            raise ValueError(
                f"experience_steps: {s.experience_steps} holds less than one sequence of"
                f" sequence_length {s.sequence_length}"
            )
        if s.pc_lambda > 0 and not self.spec.discrete:
            raise ValueError(
                f"pc_lambda: pixel control learns a Q-value per Discrete action, {self.spec.env_id}"
                f" has Box actions of shape {self.spec.action_shape} (set pc_lambda = 0)"
            )
        if s.pc_lambda > 0 and not (
            compressed_observations(self.spec) and len(self.spec.obs_shape) == 3
        ):
            raise ValueError(
                f"pc_lambda: pixel control needs image observations, {self.spec.env_id} has"
                f" {self.spec.obs_shape} {np.dtype(self.spec.obs_dtype)} (set pc_lambda = 0)"
            )

    @property
    def replayed(self) -> list[str]:
        """The auxiliary tables in use."""
        s = self.settings
        return [EXPERIENCE] * (s.pc_lambda > 0 or s.vr_lambda > 0) + [REWARDS] * (s.rp_lambda > 0)

    def table_columns(self, table: str) -> list[Column]:
        if table == EXPERIENCE:
            return unroll_columns(self.spec, self.settings.sequence_length)
        if table == REWARDS:
            reward = Column("reward", np.dtype(np.float32), ())
            return [*stacked_columns("observations", self.spec, WINDOW), reward]
        return self.columns()

    def tables(self) -> list[ReplayTableConfig]:
        s = self.settings
        capacity = {
            EXPERIENCE: s.experience_steps // s.sequence_length,
            REWARDS: s.experience_steps,
        }
        sampler = {EXPERIENCE: "uniform", REWARDS: "balanced"}
        return super().tables() + [
            ReplayTableConfig(
                name=name,
                capacity=capacity[name],
                sampler=sampler[name],
                remover="fifo",
                rate_limiter="ratio",
                min_size_to_sample=min(capacity[name], s.replay_batch),
                signature=signature(self.table_columns(name)),
            )
            for name in self.replayed
        ]

    def adders(self, num_envs: int, policy: Policy) -> list[Adder]:
        spec, s = self.spec, self.settings
        adders = super().adders(num_envs, policy)
        if EXPERIENCE in self.replayed:
            adders.append(
                ExperienceAdder(
                    num_envs,
                    s.sequence_length,
                    spec.obs_shape,
                    spec.obs_dtype,
                    gamma=self.config.gamma,
                    values=value_function(policy),
                    table=EXPERIENCE,
                    **self.action_options(),
                )
            )
        if REWARDS in self.replayed:
            adders.append(
                RewardWindowAdder(
                    num_envs, spec.obs_shape, spec.obs_dtype, s.reward_threshold, REWARDS
                )
            )
        return adders

    def auxiliary_datasets(self):
        from apexrl.algorithms.datasets import Stream

        batch = self.settings.replay_batch
        return [Stream(name, prioritized=False, batch_size=batch) for name in self.replayed]

    def network(self):
        from apexrl.algorithms.unreal.networks import UNREALNetwork

        spec, s = self.spec, self.settings
        return UNREALNetwork(
            spec.obs_shape,
            spec.obs_dtype,
            spec.num_actions,
            hidden_sizes(self.config.hidden, HIDDEN),
            pixel_control=s.pc_lambda > 0,
            reward_prediction=s.rp_lambda > 0,
            **self.network_options(),
        )
