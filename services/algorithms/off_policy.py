"""What the Ape-X algorithms (dqn, dpg) share, torch-free: n-step transitions in one prioritized
table, sampled by a stream, priorities written back, actors pulling parameters every
`pull_interval` steps."""

from dataclasses import dataclass

from apexrl.algorithms.adders.nstep import NStepAdder
from apexrl.algorithms.base import Adder, Builder, Policy
from apexrl.algorithms.columns import Column, nstep_columns
from apexrl.algorithms.tables import TABLE, PrioritizedTable
from apexrl.config import option

TARGET_TAU_HELP = (
    "share of the online network blended into the target at each sync: target <- tau * online"
    " + (1 - tau) * target (1: a hard copy; DDPG's soft update: 0.01 with"
    " target_update_interval 1)"
)


def check_target_tau(tau: float) -> None:
    if not 0.0 < tau <= 1.0:  # NaN fails too
        raise ValueError(f"target_tau: must be in (0, 1] (1: a hard copy), got {tau}")


@dataclass
class OffPolicySettings(PrioritizedTable):
    n_step: int = option(3, "n of the n-step returns the actors build", per_actor="draw")
    target_update_interval: int = option(50, "learner updates between target network syncs")
    target_tau: float = option(1.0, TARGET_TAU_HELP)


# Local mode on a small machine: each transition sampled about 8 times, the rate limiter holding
# the actors back so the learner gets its share of the cores.
SMALL_MACHINE = {
    "capacity": 100_000,
    "min_size_to_sample": 1_000,
    "samples_per_insert": 8.0,
    "error_buffer": 8_000.0,
}


class OffPolicyBuilder(Builder):
    """n-step transitions of `action_dtype` actions; subclasses make the policy and learning."""

    actor_only = ("gamma",)  # the actors' n-step discounts gamma^m travel in the items

    def item_columns(self, action_dtype) -> list[Column]:
        return nstep_columns(self.spec, action_dtype)

    def check(self) -> None:
        if self.settings.n_step < 1:
            raise ValueError(f"n_step: must be >= 1, got {self.settings.n_step}")
        check_target_tau(self.settings.target_tau)

    def adders(self, num_envs: int, policy: Policy) -> list[Adder]:
        return [NStepAdder(num_envs, self.settings.n_step, self.config.gamma, table=TABLE)]

    def dataset(self):
        from apexrl.algorithms.datasets import Stream

        return Stream(TABLE)
