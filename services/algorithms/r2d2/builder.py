"""R2D2's builder: recurrent replay distributed DQN (Kapturowski et al. 2019) on Ape-X's services.

Actors act epsilon-greedily (the Ape-X ladder) with an LSTM Q-network, a recurrent state per
env, and write overlapping sequences with the state each started from (adders/sequence.py) to
one prioritized table; the learner burns the stored state in, learns n-step double Q on
rescaled values and writes back each sequence's mixed max/mean priority.

The defaults are the paper's (and Acme's R2D2Config's): sequences of 80 steps every 40, a
burn-in of 40, n = 5, the target synced every 2,500 updates, priorities mixed with eta 0.9 and
sampled with exponent 0.9. Importance weights take beta 0.6 (the learner's `beta`, which the
presets and the r2d2 overlay set): both exponents as published.
"""

from dataclasses import dataclass

import numpy as np

from apexrl.algorithms.adders.sequence import SequenceAdder, check_sequence
from apexrl.algorithms.base import EPSILON, Adder, Builder, MetricNames, Policy, hidden_sizes
from apexrl.algorithms.columns import Column, stacked_columns
from apexrl.algorithms.envs import is_atari
from apexrl.algorithms.exploration import epsilon_ladder
from apexrl.algorithms.off_policy import TARGET_TAU_HELP, check_target_tau
from apexrl.algorithms.tables import TABLE, PrioritizedTable, redefault
from apexrl.config import option


@dataclass
class Settings(PrioritizedTable):
    """[r2d2]: R2D2's settings."""

    sequence_length: int = option(80, "env steps in each sequence an actor writes")
    sequence_period: int = option(
        40, "a sequence starts every this many steps of an episode (overlap: length - period)"
    )
    burn_in: int = option(
        40, "first steps of each sequence that only warm the stored state up, without gradient"
    )
    n_step: int = option(5, "n of the n-step double Q targets within a sequence")
    lstm_size: int = option(512, "units of the LSTM after the torso")
    priority_eta: float = option(
        0.9, "a sequence's priority: eta * max|TD error| + (1 - eta) * mean|TD error|"
    )
    target_update_interval: int = option(2500, "learner updates between target network syncs")
    target_tau: float = option(1.0, TARGET_TAU_HELP)
    # Sequences, as the paper's.
    capacity: int = redefault(PrioritizedTable, "capacity", 100_000)
    priority_exponent: float = redefault(PrioritizedTable, "priority_exponent", 0.9)
    min_size_to_sample: int = redefault(PrioritizedTable, "min_size_to_sample", 500)


# Masked or full CartPole on a 2-core machine: short sequences, a short burn-in (episodes of a
# new policy last 10 to 30 steps; the steps a burn-in takes are never learned from), a target
# synced often, each sequence sampled about 4 times.
CARTPOLE = {
    "r2d2": {
        "sequence_length": 20,
        "sequence_period": 10,
        "burn_in": 4,
        "n_step": 5,
        "lstm_size": 64,
        "target_update_interval": 100,
        "capacity": 20_000,
        "min_size_to_sample": 200,
        "samples_per_insert": 4.0,
        "error_buffer": 400.0,
    },
    "learner": {"batch_size": 32, "learning_rate": 1e-3, "beta": 0.6},
    "actor": {"insert_batch": 8},
}

# Atari on a 2-core machine: the paper's 64 sequences of 80 steps make 0.14 updates a second on
# one CPU thread, so a CPU learner takes 8 sequences of 20 (a burn-in of 5: the 4 stacked frames
# already carry the motion) and makes about 10 updates a second of 120 learned steps; Adam at
# 2e-4 for the fewer, larger batches than dqn's Atari preset (1e-4, 32 transitions); the target
# synced every 250 updates and 2 samples per inserted sequence, as dqn's.
ATARI = {
    "r2d2": {
        "sequence_length": 20,
        "sequence_period": 10,
        "burn_in": 5,
        "n_step": 5,
        "lstm_size": 256,
        "target_update_interval": 250,
        "capacity": 20_000,
        "min_size_to_sample": 200,
        "samples_per_insert": 2.0,
        "error_buffer": 400.0,
    },
    "learner": {"batch_size": 8, "learning_rate": 2e-4, "beta": 0.6, "precision": "auto"},
    "actor": {"insert_batch": 8},
}


def sequence_columns(spec, length: int, state_size: int) -> list[Column]:
    """The sequence adder's item (adders/sequence.py), time first; Discrete actions only. A
    sequence's stacks of frames go as their frames, once per step, compressed as one unit, and
    the steps where a stack starts anew (only the padding after an episode's end)."""
    f32, i64 = np.dtype(np.float32), np.dtype(np.int64)
    return [
        # Stacked frames (Atari) are stored once per step and compressed as one unit.
        *stacked_columns("observations", spec, length + 1),
        Column("actions", i64, (length,)),
        Column("rewards", f32, (length,)),
        Column("discounts", f32, (length,)),
        Column("mask", f32, (length,)),
        Column("state", f32, (state_size,)),
        Column("exploration", f32, ()),
        Column("version", i64, ()),
    ]


class R2D2Builder(Builder):
    name = "r2d2"
    Settings = Settings
    metrics = MetricNames(
        *EPSILON,
        loss_help="Importance-weighted squared TD loss of the last batch of sequences.",
        figures={"q_mean": "Mean Q(s, a) over the learned steps of the last batch."},
    )

    @classmethod
    def presets(cls, env_id: str) -> dict:
        if "CartPole" in env_id:
            return CARTPOLE
        return ATARI if is_atari(env_id) else {"learner": {"beta": 0.6}}

    def check(self) -> None:
        s = self.settings
        check_sequence(s.sequence_length, s.sequence_period, s.burn_in)
        if s.n_step < 1:
            raise ValueError(f"n_step: must be >= 1, got {s.n_step}")
        if s.lstm_size < 1:
            raise ValueError(f"lstm_size: must be >= 1, got {s.lstm_size}")
        check_target_tau(s.target_tau)
        if not 0.0 <= s.priority_eta <= 1.0:
            raise ValueError(f"priority_eta: must be in [0, 1], got {s.priority_eta}")
        if not self.spec.discrete:
            raise ValueError(
                f"algorithm: r2d2 needs a Discrete action space, {self.spec.env_id} has a"
                " continuous one (use algorithm = dpg)"
            )

    @property
    def state_size(self) -> int:
        return 2 * self.settings.lstm_size

    def columns(self) -> list[Column]:
        return sequence_columns(self.spec, self.settings.sequence_length, self.state_size)

    def exploration(self, index: int, count: int) -> float:
        return epsilon_ladder(index, count)

    def adders(self, num_envs: int, policy: Policy) -> list[Adder]:
        s, spec = self.settings, self.spec
        return [
            SequenceAdder(
                num_envs,
                s.sequence_length,
                s.sequence_period,
                spec.obs_shape,
                spec.obs_dtype,
                self.state_size,
                self.config.gamma,
                table=TABLE,
            )
        ]

    def network(self):
        from apexrl.algorithms.r2d2.networks import build_network

        spec = self.spec
        return build_network(
            spec.obs_shape,
            spec.obs_dtype,
            spec.num_actions,
            hidden_sizes(self.config.hidden),
            self.settings.lstm_size,
        )

    def policy(self):
        from apexrl.algorithms.r2d2.acting import R2D2Policy

        return R2D2Policy(self.network(), self.settings)

    def dataset(self):
        from apexrl.algorithms.datasets import Stream

        return Stream(TABLE)

    def learning(self, config, device):
        from apexrl.algorithms.r2d2.learning import R2D2Learning

        return R2D2Learning(self.network, config, self.settings, device)
