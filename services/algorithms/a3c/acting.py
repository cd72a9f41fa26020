"""A3C's actor side: the adder that turns each unroll of the actor's envs into the gradient of
the loss on it (losses.py), taken with a torch copy of the network at the parameters the actor
acted with (builder.py says why gradients are items). The policy acts as impala's and ppo's
do, in numpy on vector observations (acting and the evaluator need no torch), in torch on
frames; the gradient alone needs torch.

The unroll is adders/unroll.py's (one version's: the actor changes parameters only between
unrolls; a truncated episode's last reward carries gamma * V(final observation)); the item,
one per unroll of all the actor's envs, holds:

    gradient [P]     d loss / d theta, flattened in the order of the network's parameters()
                     (what the learner's network unflattens in the same order), float32
    version []       the parameter version it was computed on (that acted the unroll)
    loss, policy_loss, value_loss, entropy, value_mean []   the loss's figures on the unroll
"""

from collections.abc import Callable

import numpy as np
import torch

from apexrl.algorithms.a3c.losses import a3c_loss
from apexrl.algorithms.actor_critic import ActorCriticNetwork
from apexrl.algorithms.adders.unroll import UnrollAdder
from apexrl.algorithms.base import Adder, Policy, Step, value_function
from apexrl.algorithms.envs import EnvSpec
from apexrl.algorithms.networks import load_numpy_state
from apexrl.algorithms.tables import TABLE


def flat_gradient(net: torch.nn.Module) -> torch.Tensor:
    """The parameters' gradients as one float32 vector, in parameters() order (0 for a
    parameter the loss did not reach)."""
    return torch.cat(
        [
            (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).float()
            for p in net.parameters()
        ]
    )


def unroll_gradient(
    net: ActorCriticNetwork, unroll: dict[str, np.ndarray], value_cost: float, entropy_cost: float
) -> tuple[np.ndarray, dict[str, float]]:
    """The gradient of the loss on an unroll (adders/unroll.py's columns, batch-major [B, T
    (+1), ...]) at the network's parameters, flattened (flat_gradient), and its figures."""
    obs = torch.from_numpy(unroll["observations"])
    b, t1 = obs.shape[:2]
    out, values = net(obs.reshape(b * t1, *obs.shape[2:]))
    out = out.reshape(b, t1, -1).transpose(0, 1)
    values = values.reshape(b, t1).transpose(0, 1)

    def time_major(name: str) -> torch.Tensor:
        return torch.from_numpy(unroll[name]).transpose(0, 1)

    loss, figures = a3c_loss(
        out[:-1],
        values[:-1],
        values[-1],
        time_major("actions"),
        time_major("rewards"),
        time_major("discounts"),
        value_cost=value_cost,
        entropy_cost=entropy_cost,
        distribution=net.distribution,
    )
    net.zero_grad(set_to_none=True)
    loss.backward()
    gradient = flat_gradient(net).numpy()
    net.zero_grad(set_to_none=True)
    return gradient, {k: float(v) for k, v in figures.items()}


class GradientAdder(Adder):
    """Unrolls of `length` steps of every env, each turned into one gradient item as soon as it
    is complete (the learner waits for them).

    `net` is the network the gradients are taken with: the policy's own where it acts in
    torch (`weights` None), else a copy into which `weights()`, the arrays the policy acts
    with, are loaded whenever they have changed (the actor loads new ones only between
    unrolls, so an unroll's gradient is at the parameters that acted it)."""

    insert_at_once = True

    def __init__(
        self,
        num_envs: int,
        length: int,
        spec: EnvSpec,
        policy: Policy,
        net: ActorCriticNetwork,
        *,
        weights: Callable[[], dict[str, np.ndarray]] | None = None,
        gamma: float,
        value_cost: float,
        entropy_cost: float,
        action_shape: tuple[int, ...] = (),
        action_dtype=np.int64,
        table: str = TABLE,
    ):
        self.table, self.net, self.weights = table, net, weights
        self.loaded: dict[str, np.ndarray] | None = None  # the arrays net holds
        self.value_cost, self.entropy_cost = value_cost, entropy_cost
        self.unrolls = UnrollAdder(
            num_envs,
            length,
            spec.obs_shape,
            spec.obs_dtype,
            gamma=gamma,
            values=value_function(policy),
            table=table,
            action_shape=action_shape,
            action_dtype=action_dtype,
        )

    @property
    def at_boundary(self) -> bool:
        return self.unrolls.at_boundary

    def add(self, step: Step) -> dict[str, np.ndarray] | None:
        unroll = self.unrolls.add(step)
        if unroll is None:
            return None
        if self.weights is not None and self.weights() is not self.loaded:
            self.loaded = self.weights()
            load_numpy_state(self.net, self.loaded)
        gradient, figures = unroll_gradient(self.net, unroll, self.value_cost, self.entropy_cost)
        item = {"gradient": gradient[None], "version": unroll["version"][:1].copy()}
        return item | {k: np.array([v], np.float32) for k, v in figures.items()}

    def priorities(self, items, policy) -> np.ndarray:
        """A queue's items are consumed in order, not by priority: all 1."""
        return np.ones(len(items["version"]), np.float32)
