"""Ape-X DQN's builder: double DQN with a dueling network on n-step transitions from one
prioritized table, epsilon-greedy actors on a ladder (Horgan et al. 2018)."""

from dataclasses import dataclass

import numpy as np

from apexrl.algorithms.columns import Column
from apexrl.algorithms.envs import is_atari
from apexrl.algorithms.exploration import epsilon_ladder
from apexrl.algorithms.off_policy import SMALL_MACHINE, OffPolicyBuilder, OffPolicySettings


@dataclass
class Settings(OffPolicySettings):
    """[dqn]: Ape-X DQN's settings."""


class DQNBuilder(OffPolicyBuilder):
    name = "dqn"
    Settings = Settings
    exploration_name = "epsilon"
    exploration_help = "Exploration epsilon from the actor's lease (the Ape-X ladder)."

    @classmethod
    def presets(cls, env_id: str) -> dict:
        if not is_atari(env_id):
            return {"dqn": SMALL_MACHINE}
        # CleanRL's DQN Atari learner (Adam 1e-4, batch 32, the target synced every 1,000 env
        # steps of its single actor, i.e. 250 of its updates), updates in bfloat16 where the
        # hardware has it, 2 replays per transition so the actors keep pace with a CPU learner.
        return {
            "dqn": {**SMALL_MACHINE, "min_size_to_sample": 2_000, "samples_per_insert": 2.0,
                    "error_buffer": 4_000.0, "target_update_interval": 250},
            "learner": {"batch_size": 32, "learning_rate": 1e-4, "precision": "auto"},
        }  # fmt: skip

    def check(self) -> None:
        super().check()
        if not self.spec.discrete:
            raise ValueError(
                f"algorithm: dqn needs a Discrete action space, {self.spec.env_id} has a"
                " continuous one (use algorithm = dpg)"
            )

    def columns(self) -> list[Column]:
        """n-step transitions whose actions are int64 indices."""
        return self.item_columns(np.dtype(np.int64))

    def exploration(self, index: int, count: int) -> float:
        return epsilon_ladder(index, count)

    def network(self):
        from apexrl.algorithms.dqn.networks import build_network
        from apexrl.algorithms.networks import hidden_sizes

        spec = self.spec
        return build_network(
            spec.obs_shape, spec.obs_dtype, spec.num_actions, hidden_sizes(self.config.hidden)
        )

    def policy(self):
        from apexrl.algorithms.dqn.learning import DQNPolicy

        return DQNPolicy(self.network())

    def learning(self, config, device):
        from apexrl.algorithms.dqn.learning import DQNLearning

        return DQNLearning(self.network, config, self.settings, device)
