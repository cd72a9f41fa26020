"""What the on-policy algorithms (impala, ppo) share, torch-free: actors sample their policy into
unrolls of one version each, written to a queue table (each unroll sampled once, oldest first;
actors wait while it is full) that the learner reads in exact batches."""

from dataclasses import dataclass

from apexrl.algorithms.adders.unroll import UnrollAdder
from apexrl.algorithms.base import Adder, Builder, ParameterSync, Policy, hidden_sizes
from apexrl.algorithms.columns import Column, unroll_columns
from apexrl.algorithms.envs import is_atari
from apexrl.algorithms.tables import TABLE, QueueTable
from apexrl.config import option

HIDDEN = "64,64"  # the MLP torsos' sizes unless the `hidden` setting says otherwise


OPTIMIZERS = ("adam", "rmsprop")


@dataclass
class OnPolicySettings(QueueTable):
    unroll_length: int = option(32, "env steps in each unroll an actor writes")
    entropy_cost: float = option(0.01, "weight of the entropy bonus", schedule="updates")
    value_cost: float = option(0.5, "weight of the value (baseline) loss")
    optimizer: str = option(
        "adam",
        "adam (SB3's and CleanRL's PPO) or rmsprop (decay 0.99, no momentum: A2C's and IMPALA's)",
    )
    optimizer_eps: float = option(
        1e-5,
        "the optimizer's epsilon, added to the root of its second moment (it counts against the"
        " gradient's scale, and these losses are means over the batch, not sums)",
    )


# The evaluator plays every version in order, at most 30 behind the newest, from the versions
# the learner keeps (4 MB: ~110 of CartPole's 36 KB), as SB3's evaluation after every rollout
# does, instead of the newest once a second (which saw 1 version in 14 and found a solving
# one later). Not on Atari, whose versions are large and whose evaluations are long.
EVERY_VERSION = {
    "learner": {"history_mb": 4.0},
    "evaluator": {"window": 30, "interval": 0.0},
}


class OnPolicyBuilder(Builder):
    """Subclasses set Settings and learning_class (an actor_critic.UnrollLearning)."""

    exploration_name = "policy_sampling"
    exploration_help = "1: the actor samples its policy (no exploration ladder)."
    figures = {
        "value_mean": "Mean state value V(s) of the last batch.",
        "policy_loss": "Policy-gradient loss of the last update.",
        "entropy": "Mean policy entropy of the last batch.",
    }
    loss_help = "Actor-critic loss (policy, value and entropy terms) of the last update."
    parameter_sync = ParameterSync(periodic=False)
    learning_class: str  # "module:attribute" of its UnrollLearning, imported on use

    @classmethod
    def small_machine(cls, env_id: str, learner: dict) -> dict:
        """Local mode's presets: 2 actors x 4 envs x 32 steps = 8 unrolls = 256 steps a batch
        (rl-baselines3-zoo's CartPole PPO: 8 envs x 32 steps), Adam at 2e-3."""
        presets = {
            "learner": {"batch_size": 8, "learning_rate": 2e-3, **learner},
            "actor": {"num_envs": 4},
        }
        if not is_atari(env_id):
            presets["learner"] |= EVERY_VERSION["learner"]
            presets["evaluator"] = dict(EVERY_VERSION["evaluator"])
        return presets

    def check(self) -> None:
        self.columns()  # refuses continuous action spaces and a bad unroll_length
        if self.settings.optimizer not in OPTIMIZERS:
            raise ValueError(
                f"optimizer: must be one of {', '.join(OPTIMIZERS)}, got {self.settings.optimizer!r}"
            )
        if not self.settings.optimizer_eps > 0:
            raise ValueError(f"optimizer_eps: must be > 0, got {self.settings.optimizer_eps}")

    def columns(self) -> list[Column]:
        return unroll_columns(self.spec, self.settings.unroll_length, self.name)

    def exploration(self, index: int, count: int) -> float:
        """No ladder: every actor samples its policy (1 = sample, 0 would be greedy)."""
        return 1.0

    def adder(self, num_envs: int, policy: Policy) -> Adder:
        spec = self.spec
        return UnrollAdder(
            num_envs, self.settings.unroll_length, spec.obs_shape, spec.obs_dtype,
            gamma=self.config.gamma, values=policy.values, table=TABLE,
        )  # fmt: skip

    def dataset(self):
        from apexrl.algorithms.datasets import Queue

        return Queue(TABLE)

    def network(self):
        from apexrl.algorithms.actor_critic import ActorCriticNetwork

        spec = self.spec
        return ActorCriticNetwork(
            spec.obs_shape, spec.obs_dtype, spec.num_actions,
            hidden_sizes(self.config.hidden, HIDDEN),
        )  # fmt: skip

    def policy(self):
        """In numpy for MLPs (no torch in the actor: algorithms/numpy_policies.py)."""
        if self.spec.vector_obs:
            from apexrl.algorithms.numpy_policies import MLPActorCriticPolicy

            return MLPActorCriticPolicy(len(hidden_sizes(self.config.hidden, HIDDEN)))
        from apexrl.algorithms.actor_critic import ActorCriticPolicy

        return ActorCriticPolicy(self.network())

    def learning(self, config, device):
        import importlib

        module, attribute = self.learning_class.split(":")
        learning = getattr(importlib.import_module(module), attribute)
        return learning(self.network, config, self.settings, device)
