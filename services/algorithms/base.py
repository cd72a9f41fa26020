"""What an algorithm is to the services: three small interfaces (Acme's shape, without its weight).

- `Algorithm`: built from the shared agent settings and the env's spaces; declares the columns
  its transitions carry, its exploration ladder, and makes the two halves below.
- `Policy` (actors, evaluator, `apexrl eval`): acts on the published parameters, with the
  exploration parameter an actor's lease gives it, or greedily; computes the initial
  priorities of the transitions an actor sends.
- `Learning` (learner): the networks, targets and optimizers; one update step on a sampled
  batch returns the new priorities; the parameters to publish; what a checkpoint holds.

The services stay algorithm-agnostic: sampling, threads, parameter serving, leases, checkpoint
I/O, n-step adding and inserting live there, once.

Checkpoint layout, every algorithm: the published parameters under "online/" (so a best
model and a learner checkpoint are played the same way), everything else under names of the
algorithm's choosing, JSON-able extras (optimizer param groups) in the meta.
"""

from abc import ABC, abstractmethod
from typing import ClassVar

import numpy as np
import torch

# Re-exported: the columns live torch-free in columns.py.
from apexrl.algorithms.columns import Column, action_bounds, nstep_columns  # noqa: F401
from apexrl.algorithms.envs import EnvSpec


class Policy(ABC):
    """The acting half: runs on actors and evaluators, on the CPU."""

    @abstractmethod
    def load(self, arrays: dict[str, np.ndarray]) -> None:
        """Takes published parameters (Learning.parameters(), as they came over the wire)."""

    @abstractmethod
    def act(self, obs: np.ndarray, exploration: float, rng: np.random.Generator) -> np.ndarray:
        """Actions [B, ...] for observations [B, ...]; exploration 0 is the evaluation policy."""

    @abstractmethod
    def priorities(self, columns: dict[str, np.ndarray]) -> np.ndarray:
        """|TD error| [B] of transitions, from the policy's own networks (Ape-X's initial
        priorities; the caller adds the priority epsilon)."""


class Learning(ABC):
    """The learning half: networks, targets, optimizers, the update step."""

    @abstractmethod
    def update(
        self, batch: dict[str, torch.Tensor], weights: torch.Tensor, step: int
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """One update on a sampled batch (columns on the device, importance weights [B]); step
        counts updates from 1. Returns the detached |TD errors| [B] (the new priorities, before
        the priority epsilon) and figures for metrics ("loss", "q_mean", ...)."""

    @abstractmethod
    def parameters(self) -> dict[str, np.ndarray]:
        """The parameters actors and evaluators need (float32 numpy, copied)."""

    @abstractmethod
    def state(self) -> tuple[dict[str, np.ndarray], dict]:
        """(arrays, JSON-able meta) of a checkpoint; parameters() under "online/"."""

    @abstractmethod
    def load_state(self, arrays: dict[str, np.ndarray], meta: dict) -> None:
        """Restores what state() returned."""


class Algorithm(ABC):
    """One algorithm for one env; the registry (algorithms/__init__.py) names it."""

    name: ClassVar[str]
    # What the exploration parameter is ("epsilon", "noise_scale"): the actor's metric name.
    exploration_name: ClassVar[str]
    # On-policy algorithms (actor_critic.py): actors write unrolls, not n-step transitions.
    unrolls: ClassVar[bool] = False
    # The learner trains only on unrolls of its current version (ppo), not on older ones.
    current_version_only: ClassVar[bool] = False

    def __init__(self, config, spec: EnvSpec):
        """config: the shared agent settings (config.AgentConfig or a service's superset)."""
        self.config, self.spec = config, spec

    @abstractmethod
    def columns(self) -> list[Column]:
        """The columns of the transitions actors insert and the learner samples."""

    @abstractmethod
    def exploration(self, index: int, count: int) -> float:
        """The exploration parameter of place `index` among `count` live actors."""

    @abstractmethod
    def policy(self) -> Policy: ...

    @abstractmethod
    def learning(self, config, device: torch.device) -> Learning:
        """config: the learner's settings (learning rates, target syncs, ...)."""


def adam(parameters, lr: float, **options) -> torch.optim.Adam:
    """Adam as every learner here makes it: fused (one kernel over all parameters; a Nature-CNN
    step on one CPU core takes 1.5 ms instead of 10.2, a 128x128 MLP's 0.13 instead of 0.31)."""
    return torch.optim.Adam(parameters, lr=lr, fused=True, **options)


def optimizer_state(
    optimizer: torch.optim.Optimizer, prefix: str
) -> tuple[dict[str, np.ndarray], list]:
    """An optimizer's tensors as prefix/<param index>/<key> arrays, and its param groups."""
    state = optimizer.state_dict()
    arrays = {
        f"{prefix}/{index}/{key}": value.detach().cpu().numpy()
        for index, entries in state["state"].items()
        for key, value in entries.items()
    }
    return arrays, state["param_groups"]


def load_optimizer_state(
    optimizer: torch.optim.Optimizer, arrays: dict[str, np.ndarray], prefix: str, groups: list
) -> None:
    state: dict[int, dict[str, torch.Tensor]] = {}
    for name, value in arrays.items():
        if name.startswith(prefix + "/"):
            index, key = name[len(prefix) + 1 :].split("/")
            state.setdefault(int(index), {})[key] = torch.from_numpy(value.copy())
    optimizer.load_state_dict({"state": state, "param_groups": groups})


def prefixed(arrays: dict[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    """The arrays under prefix/, with the prefix taken off."""
    return {k[len(prefix) + 1 :]: v for k, v in arrays.items() if k.startswith(prefix + "/")}
