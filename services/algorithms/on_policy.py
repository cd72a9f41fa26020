"""What the on-policy algorithms (impala, ppo) share, torch-free: actors sample their policy into
unrolls of one version each, written to a queue table (each unroll sampled once, oldest first;
actors wait while it is full) that the learner reads in exact batches.

The policy is a softmax over a Discrete action space, a diagonal Gaussian over a Box one
(gaussian.py); observations and rewards may be normalized by running statistics that travel
with the parameters (normalizer.py)."""

from dataclasses import dataclass

import numpy as np

from apexrl.algorithms.adders.unroll import UnrollAdder
from apexrl.algorithms.base import (
    Adder,
    Builder,
    MetricNames,
    ParameterSync,
    Policy,
    hidden_sizes,
    value_function,
)
from apexrl.algorithms.columns import Column, unroll_columns
from apexrl.algorithms.envs import is_atari
from apexrl.algorithms.tables import TABLE, QueueTable
from apexrl.config import option

PENDULUM = "Pendulum-v1"
HIDDEN = "64,64"  # the MLP torsos' sizes unless the `hidden` setting says otherwise


OPTIMIZERS = ("adam", "rmsprop")
DISTRIBUTIONS = ("auto", "softmax", "gaussian")


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
    distribution: str = option(
        "auto",
        "the policy: softmax (Discrete actions), gaussian (Box actions: a diagonal Gaussian with"
        " a learned, state-independent log-std; samples clipped to the bounds), or auto (the"
        " one the env's action space takes)",
    )
    log_std_init: float = option(0.0, "gaussian: the log-std's first value (0: std 1, as SB3's)")
    normalize_observations: bool = option(
        False,
        "observations normalized by their running mean and variance, clipped to +-10 (SB3's"
        " VecNormalize); the statistics travel with the parameters (vector observations only)",
    )
    normalize_rewards: bool = option(
        False,
        "rewards divided by the running std of the discounted return, clipped to +-10 (SB3's"
        " VecNormalize); the statistics travel with the parameters",
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

    metrics = MetricNames(
        exploration="policy_sampling",
        exploration_help="1: the actor samples its policy (no exploration ladder).",
        loss_help="Actor-critic loss (policy, value and entropy terms) of the last update.",
        figures={
            "value_mean": "Mean state value V(s) of the last batch.",
            "policy_loss": "Policy-gradient loss of the last update.",
            "entropy": "Mean policy entropy of the last batch.",
        },
    )
    learning_class: str  # "module:attribute" of its UnrollLearning, imported on use

    @property
    def parameter_sync(self) -> ParameterSync:
        return ParameterSync(periodic=False)

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

    @classmethod
    def pendulum(cls, learner: dict) -> dict:
        """Pendulum-v1's presets, rl-baselines3-zoo's ppo settings for it where they apply: 4
        envs (2 actors x 2) x 1024 steps a batch, gamma 0.9, Adam at 1e-3, gradient norm 0.5
        (SB3's default), no entropy bonus; the zoo's use_sde (gSDE) is ppo's own preset."""
        presets = cls.small_machine(PENDULUM, {"batch_size": 4, "learning_rate": 1e-3})
        presets["learner"] |= {"max_grad_norm": 0.5, "gamma": 0.9, **learner}
        presets["actor"] = {"num_envs": 2, "gamma": 0.9}
        presets.setdefault("evaluator", {})["nice"] = 10
        return presets

    def check(self) -> None:
        self.columns()  # refuses a bad unroll_length
        self.check_policy()
        optimizer = self.settings.optimizer
        if optimizer not in OPTIMIZERS:
            raise ValueError(
                f"optimizer: must be one of {', '.join(OPTIMIZERS)}, got {optimizer!r}"
            )
        if not self.settings.optimizer_eps > 0:
            raise ValueError(f"optimizer_eps: must be > 0, got {self.settings.optimizer_eps}")
        if self.settings.capacity < 1:
            raise ValueError(f"capacity: must be >= 1, got {self.settings.capacity}")
        for name in ("entropy_cost", "value_cost"):
            if not getattr(self.settings, name) >= 0:  # NaN fails too
                raise ValueError(f"{name}: must be >= 0, got {getattr(self.settings, name)}")

    def check_policy(self) -> None:
        """Refuses a policy the action space cannot take, and normalization it cannot use."""
        s, spec = self.settings, self.spec
        if s.distribution not in DISTRIBUTIONS:
            raise ValueError(
                f"distribution: must be one of {', '.join(DISTRIBUTIONS)}, got {s.distribution!r}"
            )
        space = f"a Box one of shape {spec.action_shape}"
        if spec.discrete:
            space = f"a Discrete one with {spec.num_actions} actions"
        wanted = "softmax" if spec.discrete else "gaussian"
        if s.distribution not in ("auto", wanted):
            raise ValueError(
                f"distribution: {s.distribution} needs {'a Box' if spec.discrete else 'a Discrete'}"
                f" action space; {spec.env_id} has {space} (use {wanted} or auto)"
            )
        if not np.isfinite(s.log_std_init):
            raise ValueError(f"log_std_init: must be finite, got {s.log_std_init}")
        if spec.discrete and s.log_std_init != 0:
            raise ValueError(
                f"log_std_init: sets a Gaussian policy's log-std; {spec.env_id} has {space}"
                " (a softmax policy: leave it at 0)"
            )
        if not spec.discrete and len(spec.action_shape) != 1:
            raise ValueError(
                f"env {spec.env_id}: a Gaussian policy needs 1-D Box actions, got {space}"
            )
        if s.normalize_observations and not spec.vector_obs:
            raise ValueError(
                f"normalize_observations: needs vector observations, {spec.env_id} has"
                f" {spec.obs_shape} {np.dtype(spec.obs_dtype)}"
            )

    def columns(self) -> list[Column]:
        s = self.settings
        return unroll_columns(self.spec, s.unroll_length, returns=s.normalize_rewards)

    def exploration(self, index: int, count: int) -> float:
        """No ladder: every actor samples its policy (1 = sample, 0 would be greedy)."""
        return 1.0

    def adders(self, num_envs: int, policy: Policy) -> list[Adder]:
        spec = self.spec
        return [
            UnrollAdder(
                num_envs,
                self.settings.unroll_length,
                spec.obs_shape,
                spec.obs_dtype,
                gamma=self.config.gamma,
                values=value_function(policy),
                table=TABLE,
                **self.action_options(),
                returns=self.settings.normalize_rewards,
            )
        ]

    def action_options(self) -> dict:
        """The actions an adder records: int64 indices, or float32 Gaussian samples."""
        if self.spec.discrete:
            return {"action_shape": (), "action_dtype": np.int64}
        return {"action_shape": self.spec.action_shape, "action_dtype": np.float32}

    def network_options(self) -> dict:
        """ActorCriticNetwork's keyword arguments: the Gaussian's and the normalizers'."""
        spec = self.spec
        return {
            "action_dims": 0 if spec.discrete else int(np.prod(spec.action_shape)),
            "log_std_init": self.settings.log_std_init,
            **self.normalizers(),
        }

    def normalizers(self) -> dict:
        """The policy's and the network's normalizers, as the settings ask."""
        s = self.settings
        return {"normalize_obs": s.normalize_observations, "normalize_returns": s.normalize_rewards}

    def action_head(self):
        """How the policy's output becomes actions (numpy_policies: Softmax, ClippedGaussian)."""
        from apexrl.algorithms.numpy_policies import ClippedGaussian, Softmax

        spec = self.spec
        return Softmax() if spec.discrete else ClippedGaussian(spec.action_low, spec.action_high)

    def dataset(self):
        from apexrl.algorithms.datasets import Queue

        return Queue(TABLE)

    def network(self):
        from apexrl.algorithms.actor_critic import ActorCriticNetwork

        spec = self.spec
        return ActorCriticNetwork(
            spec.obs_shape,
            spec.obs_dtype,
            spec.num_actions,
            hidden_sizes(self.config.hidden, HIDDEN),
            **self.network_options(),
        )

    def policy(self):
        """In numpy for MLPs (no torch in the actor: algorithms/numpy_policies.py)."""
        if self.spec.vector_obs:
            from apexrl.algorithms.numpy_policies import MLPActorCriticPolicy

            depth = len(hidden_sizes(self.config.hidden, HIDDEN))
            return MLPActorCriticPolicy(depth, self.action_head(), **self.normalizers())
        from apexrl.algorithms.actor_critic import ActorCriticPolicy

        return ActorCriticPolicy(self.network(), self.action_head())

    def learning(self, config, device):
        import importlib

        module, attribute = self.learning_class.split(":")
        learning = getattr(importlib.import_module(module), attribute)
        return learning(self.network, config, self.settings, device)
