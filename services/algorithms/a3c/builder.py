"""A3C's builder (Mnih et al. 2016, "Asynchronous Methods for Deep Reinforcement Learning"):
asynchronous advantage actor-critic, the actors computing the gradients.

Each actor acts `unroll_length` steps of its envs on its own copy of the network, computes the
gradient of the advantage actor-critic loss on that unroll (n-step returns bootstrapped from
V of the observation after it, an entropy bonus: losses.py) with that copy, and sends it; the
learner applies every gradient as it comes to the shared parameters, with one RMSProp whose
statistics every actor's gradients share (the paper's "shared RMSProp"), and publishes a new
version after each. An actor takes the newest version after each push before acting again
(it waits, up to a second, for one newer than the version its gradient was computed on).

Design: **gradients are items of a queue table** in the replay, as unrolls are impala's. The
actor's adder (acting.py) turns each unroll into one item, the flattened float32 gradient
(the network's parameters in their order, `gradient` [P]) with the version it was computed on
and the loss's figures; the learner's dataset drains the queue, one gradient an update. So the
services stay algorithm-agnostic (no RPC of its own, no branch in the actor or learner loops:
what an item holds is the builder's business), the replay's rate limiter holds actors back when
the learner falls behind (the queue's `capacity`), and the learner's RMSProp is the one place
the statistics live. The cost, against an RPC straight to the learner: one replay hop (an insert
and a sample) per gradient.

A gradient computed on a version more than `max_staleness` behind the learner's newest when
its turn comes is dropped and counted (`apexrl_learner_stale_items_dropped_total`, as on-policy
items are), as is one of a version the learner never published (a learner restarted from an
older checkpoint); each applied gradient's staleness is the `staleness` figure.

Discrete actions take a softmax policy; 1-D Box actions a diagonal Gaussian (gaussian.py), as
impala's and ppo's, acting as theirs do (in numpy on vector observations: the evaluator needs
no torch). Unlike the other algorithms' actors, an a3c actor imports torch: it takes gradients.
"""

import dataclasses
from dataclasses import dataclass

import numpy as np

from apexrl.algorithms.base import Adder, ParameterSync, Policy, hidden_sizes
from apexrl.algorithms.columns import Column
from apexrl.algorithms.envs import EnvSpec, is_atari
from apexrl.algorithms.on_policy import HIDDEN, PENDULUM, OnPolicyBuilder
from apexrl.algorithms.tables import TABLE, QueueTable, redefault
from apexrl.config import option

# The loss's figures an actor computes on its unroll and sends beside its gradient (columns of
# float32 scalars); the learner reports the mean of those it applied.
ITEM_FIGURES = {
    "policy_loss": "Policy-gradient loss of the last applied gradient's unroll.",
    "value_loss": "Value loss, 1/2 (R - V)^2, of the last applied gradient's unroll.",
    "entropy": "Mean policy entropy of the last applied gradient's unroll.",
    "value_mean": "Mean state value V(s) of the last applied gradient's unroll.",
}

# networks.NatureConvTorso's convolutions: (output channels, kernel, stride).
NATURE_CONVS = ((32, 8, 4), (64, 4, 2), (64, 3, 1))


@dataclass
class Settings(QueueTable):
    """[a3c]: A3C's settings (`capacity`: the gradients its queue holds)."""

    capacity: int = redefault(QueueTable, "capacity", 8)
    unroll_length: int = option(
        5, "t_max: env steps of each unroll an actor takes a gradient on (the paper's 5)"
    )
    max_staleness: int = option(
        8,
        "a gradient computed on a version more than this many behind the learner's newest when"
        " its turn comes is dropped and counted (0: only gradients of the newest version)",
    )
    entropy_cost: float = option(0.01, "weight of the entropy bonus (the paper's 0.01)")
    value_cost: float = option(0.5, "weight of the value loss, 1/2 (R - V)^2")
    optimizer: str = option(
        "rmsprop",
        "rmsprop (decay 0.99, no momentum: the paper's shared RMSProp) or adam, in the learner",
    )
    optimizer_eps: float = option(
        1e-5, "the optimizer's epsilon, added to the root of its second moment"
    )


def gradient_size(spec: EnvSpec, hidden: tuple[int, ...]) -> int:
    """The parameters of the actor-critic network (actor_critic.ActorCriticNetwork, no
    normalizers) on `spec`: the length of the gradient column, counted without torch (local
    mode's parent and the replay read the columns without it). Vector observations: two MLP
    torsos of `hidden`; images: one Nature CNN."""
    if spec.vector_obs:
        width, torso = spec.obs_shape[0], 0
        for size in hidden:
            torso, width = torso + width * size + size, size
        torsos, features = 2 * torso, width
    else:
        channels, height, width = spec.obs_shape
        flat: tuple[int, ...]
        convs, flat, inputs = 0, (height, width), channels
        for outputs, kernel, stride in NATURE_CONVS:
            convs += inputs * outputs * kernel * kernel + outputs
            inputs = outputs
            flat = tuple((side - kernel) // stride + 1 for side in flat)
        torsos, features = convs + 64 * flat[0] * flat[1] * 512 + 512, 512
    if spec.discrete:
        head = features * spec.num_actions + spec.num_actions
    else:
        dims = int(np.prod(spec.action_shape))
        head = features * dims + 2 * dims  # the mean's weights and biases, the log-std
    return torsos + head + features + 1  # and the value's


class A3CBuilder(OnPolicyBuilder):
    name = "a3c"
    Settings = Settings
    # After each gradient the actor waits (up to wait_seconds) for a version newer than the
    # one it computed the gradient on, and acts on that.
    parameter_sync = ParameterSync(periodic=False, newer_each_item=True, wait_seconds=1.0)
    learning_class = "apexrl.algorithms.a3c.learning:A3CLearning"
    metrics = dataclasses.replace(
        OnPolicyBuilder.metrics,
        loss_help="A3C loss (policy, value and entropy terms) of the last applied gradient's"
        " unroll.",
        figures={
            **ITEM_FIGURES,
            "staleness": "Versions the learner published between the version the last applied"
            " gradient was computed on and the update applying it.",
            "gradient_norm": "Norm of the last applied gradient, before clipping.",
        },
    )

    @classmethod
    def presets(cls, env_id: str) -> dict:
        """Local mode: 2 actors x 4 envs, RMSProp at 2e-3, one gradient an update. Off Atari,
        unrolls of 16 steps: on CartPole-v1 they solved in a median 4.0 s of training over 3
        seeds against 6.5 s for the paper's 5 (docs/benchmarks.md)."""
        presets = cls.small_machine(env_id, {"learning_rate": 2e-3})
        presets["learner"].pop("batch_size")  # one gradient an update, whatever it says
        if env_id == PENDULUM:
            # The notes' Pendulum A3C: rewards (r + 8) / 8, gamma 0.9 (the actors take the
            # gradients, so they need it); unrolls of 32 without the entropy bonus at 1e-3.
            presets["learner"] |= {"learning_rate": 1e-3, "gamma": 0.9}
            presets["actor"] |= {"gamma": 0.9, "reward_scale": 0.125, "reward_offset": 1.0}
            presets["a3c"] = {"unroll_length": 32, "entropy_cost": 0.0}
        elif not is_atari(env_id):
            presets["a3c"] = {"unroll_length": 16}
        return presets

    def check(self) -> None:
        super().check()  # action space, unroll_length, optimizer, costs, capacity
        s = self.settings
        if s.max_staleness < 0:
            raise ValueError(f"max_staleness: must be >= 0, got {s.max_staleness}")

    def check_policy(self) -> None:
        """A softmax on Discrete actions, a Gaussian on 1-D Box ones; no normalizers."""
        spec = self.spec
        if not spec.discrete and len(spec.action_shape) != 1:
            raise ValueError(
                f"algorithm: a3c acts in Discrete or 1-D Box action spaces; {spec.env_id} has a"
                f" Box one of shape {spec.action_shape}"
            )

    def network_options(self) -> dict:
        spec = self.spec
        return {"action_dims": 0 if spec.discrete else int(np.prod(spec.action_shape))}

    def normalizers(self) -> dict:
        return {}

    def columns(self) -> list[Column]:
        if self.settings.unroll_length < 1:
            raise ValueError(f"unroll_length: must be >= 1, got {self.settings.unroll_length}")
        size = gradient_size(self.spec, hidden_sizes(self.config.hidden, HIDDEN))
        f32 = np.dtype(np.float32)
        return [
            Column("gradient", f32, (size,)),
            Column("version", np.dtype(np.int64), ()),
            Column("loss", f32, ()),
            *(Column(name, f32, ()) for name in ITEM_FIGURES),
        ]

    def adders(self, num_envs: int, policy: Policy) -> list[Adder]:
        from apexrl.algorithms.a3c.acting import GradientAdder
        from apexrl.algorithms.actor_critic import ActorCriticPolicy
        from apexrl.algorithms.numpy_policies import NumpyPolicy

        if isinstance(policy, ActorCriticPolicy):  # frames: it acts with a network of its own
            net, weights = policy.net, None
        elif isinstance(policy, NumpyPolicy):  # vector observations: in numpy on its arrays
            net, weights = self.network(), lambda: policy.arrays
        else:
            raise ValueError(f"policy: a3c acts with an actor-critic, got {type(policy).__name__}")
        s = self.settings
        return [
            GradientAdder(
                num_envs,
                s.unroll_length,
                self.spec,
                policy,
                net,
                weights=weights,
                gamma=self.config.gamma,
                value_cost=s.value_cost,
                entropy_cost=s.entropy_cost,
                **self.action_options(),
            )
        ]

    def dataset(self):
        from apexrl.algorithms.a3c.learning import FreshGradients

        return FreshGradients(TABLE, max_staleness=self.settings.max_staleness)
