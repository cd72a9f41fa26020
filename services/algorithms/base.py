"""What an algorithm is to the services: a builder and the small interfaces it makes (Acme's
shape). The services call these and never look behind them: no service tests which algorithm
or family it runs.

- `Builder` (one per algorithm folder, `<name>/builder.py`, registered in algorithms/__init__.py):
  its settings (a dataclass: the `[<name>]` table of the config file, its flags and `--help`),
  its tuned presets per env, the replay tables it needs, and the factories below.
- `Policy` (actors, the evaluator, `apexrl eval`): acts on published parameters, greedily or
  with the exploration parameter an actor's lease gives it; `step` returns what the adder
  records besides the actions; computes the initial priorities of the items an actor sends.
- `Adder` (actors): turns the actor's steps into replay items, and says when the actor may
  change its parameters.
- `Dataset` (learner): how the learner reads its table (algorithms/datasets.py).
- `Learning` (learner): networks, targets, optimizers; one update on a batch returns the new
  priorities (or None) and the figures it reports as metrics; the parameters to publish; what
  a checkpoint holds.

This module, the builders and the adders import no torch: local mode's parent process and the
replay read the tables without it. What needs torch is imported where it is made.

Checkpoint layout, every algorithm: the published parameters under "online/" (so a best model
and a learner checkpoint are played the same way), everything else under names of the
algorithm's choosing, JSON-able extras (optimizer param groups) in the meta.

Writing an algorithm: a folder with a `builder.py` (a Builder subclass with its Settings
dataclass), its policy and learning (networks, a pure loss, the update step), one line in
ALGORITHMS, its tests. docs/algorithms.md walks through one.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

import numpy as np

# Re-exported: the columns live in columns.py.
from apexrl.algorithms.columns import Column, action_bounds, nstep_columns  # noqa: F401
from apexrl.algorithms.envs import EnvSpec
from apexrl.algorithms.tables import TABLE
from apexrl.config import AgentConfig, ReplayTableConfig
from apexrl.draws import Draw
from apexrl.schedules import Schedule

if TYPE_CHECKING:
    import torch
    from _typeshed import DataclassInstance

    from apexrl.algorithms.datasets import Dataset


@dataclass
class Step:
    """One step of an actor's vector env, as its adder sees it (arrays [num_envs, ...])."""

    obs: np.ndarray  # the observations acted on
    actions: np.ndarray
    extras: dict[str, np.ndarray]  # what Policy.step returned besides the actions
    rewards: np.ndarray  # float32, the learnt ones: shaped as algorithms/rewards.py says
    ends: np.ndarray  # bool: the episode ended here (terminated, or a life lost)
    truncated: np.ndarray  # bool: the episode was cut by a time limit
    next_obs: np.ndarray  # the observations after the step (a new episode's first where one ended)
    final_obs: np.ndarray  # as next_obs, but the ended episodes' last observations
    version: int  # the parameter version that acted


class Policy(ABC):
    """The acting half: runs on actors and evaluators, on the CPU."""

    @abstractmethod
    def load(self, arrays: dict[str, np.ndarray]) -> None:
        """Takes published parameters (Learning.parameters(), as they came over the wire)."""

    @abstractmethod
    def act(self, obs: np.ndarray, exploration: float, rng: np.random.Generator) -> np.ndarray:
        """Actions [B, ...] for observations [B, ...]; exploration 0 is the evaluation policy."""

    def step(
        self, obs: np.ndarray, exploration: float, rng: np.random.Generator
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """An actor's step: the actions and what its adder records besides them (behaviour
        log-probabilities, values, recurrent state); by default act() and nothing more."""
        return self.act(obs, exploration, rng), {}

    def episode_starts(self, starts: np.ndarray) -> None:  # noqa: B027 (stateless: nothing)
        """Which envs (bool [num_envs], one per env the caller acts in) begin an episode at
        their next observation: a recurrent policy resets their state. Called with all True
        before the first act or step; a new length is a new set of envs."""

    def keep_envs(self, envs: np.ndarray) -> None:  # noqa: B027 (stateless: nothing)
        """Only the envs at these indices act from now on, in this order (the others' episodes
        ended and are not restarted: an evaluation's)."""

    @abstractmethod
    def priorities(self, items: dict[str, np.ndarray]) -> np.ndarray:
        """Initial priorities [B] of items the adder made, before the priority epsilon (Ape-X:
        |TD error| from the actor's own networks; 1 where the table is not prioritized)."""


@runtime_checkable
class ValuePolicy(Protocol):
    """A policy with a state-value function (the actor-critics'): V(obs) [B] in the env's
    reward units, with which adders bootstrap a truncated episode's last reward."""

    def values(self, obs: np.ndarray) -> np.ndarray: ...


def value_function(policy: Policy) -> Callable[[np.ndarray], np.ndarray]:
    """policy.values (ValueError for a policy without a value function)."""
    if not isinstance(policy, ValuePolicy):
        raise ValueError(f"policy: {type(policy).__name__} has no value function (values)")
    return policy.values


class Adder(ABC):
    """Turns an actor's steps into the items of one replay table (Acme's adders)."""

    table: str  # the table its items go to

    # Items go to replay as soon as they are made (False: gathered into inserts of the
    # actor's insert_batch items).
    insert_at_once: ClassVar[bool] = False
    # Fields of its items that only the initial priorities read (what the actor acted on):
    # the actor leaves them out of what replay stores.
    acting_fields: ClassVar[tuple[str, ...]] = ()

    @property
    def at_boundary(self) -> bool:
        """Whether the actor may change its parameters now (an item spanning several steps is
        acted by one version)."""
        return True

    @abstractmethod
    def add(self, step: Step) -> dict[str, np.ndarray] | None:
        """Takes one step of every env; returns the items it completed (columns, batch-major),
        or None."""

    def priorities(self, items: dict[str, np.ndarray], policy: Policy) -> np.ndarray:
        """Initial priorities [B] of items it made, before the priority epsilon: the policy's,
        unless the table's sampler reads them otherwise (a class mark, say)."""
        return policy.priorities(items)


class Learning(ABC):
    """The learning half: networks, targets, optimizers, the update step."""

    @abstractmethod
    def update(
        self, batch: dict[str, torch.Tensor], weights: torch.Tensor, step: int
    ) -> tuple[torch.Tensor | None, dict[str, float]]:
        """One update on a sampled batch (columns on the device, importance weights [B]); step
        counts updates from 1. Returns the new priorities [B] (detached, before the priority
        epsilon; None when the table is not prioritized) and the figures the builder declares
        (MetricNames.figures), by name; "loss" always."""

    def optimizers(self) -> list[torch.optim.Optimizer]:
        """Its optimizers, whose learning rates a `learning_rate` schedule moves (default:
        every optimizer among its attributes)."""
        import torch

        return [v for v in vars(self).values() if isinstance(v, torch.optim.Optimizer)]

    def imitation(self, obs: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """Behaviour cloning's hook (learner/pretraining.py): the output of the policy the
        actors act by on observations [B, ...], with gradients, and its distribution, whose
        `evaluate(out, actions)` returns log pi(actions) first (ppo.losses.Categorical over
        logits, gaussian.DiagGaussian over a Gaussian's mean and log-std). Default: no policy
        to clone (ValueError naming the setting)."""
        raise ValueError(
            f"pretrain_demonstrations: {type(self).__name__} has no policy behaviour cloning can"
            " train (leave it empty)"
        )

    def cloned(self) -> None:  # noqa: B027 (a hook: most have nothing to follow the weights)
        """After behaviour cloning: what must follow the policy's new weights (a target)."""

    @abstractmethod
    def parameters(self) -> dict[str, np.ndarray]:
        """The parameters actors and evaluators need (float32 numpy, copied)."""

    @abstractmethod
    def state(self) -> tuple[dict[str, np.ndarray], dict]:
        """(arrays, JSON-able meta) of a checkpoint; parameters() under "online/"."""

    @abstractmethod
    def load_state(self, arrays: dict[str, np.ndarray], meta: dict) -> None:
        """Restores what state() returned."""


@dataclass(frozen=True)
class ParameterSync:
    """When an actor takes new parameters from the learner."""

    # Pull every actor `pull_interval` env steps (False: after each item the adder completes).
    periodic: bool = True
    # Each item must be acted by a version newer than the previous item's: after an item the
    # actor waits (up to `wait_seconds`) for the learner to publish one.
    newer_each_item: bool = False
    wait_seconds: float = 1.0


@dataclass(frozen=True)
class MetricNames:
    """An algorithm's metrics under its own names: its exploration parameter on the actor
    (apexrl_actor_<exploration>), and on the learner the loss's help and the figures
    Learning.update reports besides "loss" (apexrl_learner_<name> -> help)."""

    exploration: str
    exploration_help: str
    loss_help: str = "Training loss of the last update."
    figures: Mapping[str, str] = dataclasses.field(default_factory=dict)


EPSILON = ("epsilon", "Exploration epsilon from the actor's lease (the Ape-X ladder).")


def values_taken(setting: Any) -> tuple:
    """What a schedule passes through or a distribution may draw (its bounds): each checked."""
    if isinstance(setting, Schedule):
        return tuple(value for _, value in setting.points)
    return setting.values if isinstance(setting, Draw) else ()


class Builder(ABC):
    """One algorithm for one env, built from the service's config (its `algo` holds this
    algorithm's Settings) and the env's spaces."""

    name: ClassVar[str]
    # The algorithm's own settings: a dataclass whose fields use config.option (documented);
    # the `[<name>]` table of the config file, flags --<field>, env APEXRL_<FIELD>.
    Settings: ClassVar[type[DataclassInstance]]
    metrics: ClassVar[MetricNames]
    # The shared settings (AgentConfig's) each of its actors may draw for itself (draws.py):
    # its actors alone read them, its items carrying what the learner needs (gamma: n-step
    # transitions' discounts).
    actor_only: ClassVar[tuple[str, ...]] = ()

    def __init__(self, config, spec: EnvSpec):
        """config: a service's config (config.AgentConfig or a superset); spec: the env's."""
        self.config, self.spec = config, spec
        # Any: each algorithm reads the fields of its own Settings.
        self.settings: Any = config.algo if config.algo is not None else self.Settings()
        if not isinstance(self.settings, self.Settings):
            raise ValueError(
                f"algorithm: {self.name} takes its settings from [{self.name}], got"
                f" {type(self.settings).__name__}"
            )
        self.refuse_draws(config)
        self.check()
        for f in dataclasses.fields(self.settings):  # every value a setting may take checked
            schedule = getattr(self.settings, f.name)
            for value in values_taken(schedule):
                setattr(self.settings, f.name, value)
                try:
                    self.check()
                finally:
                    setattr(self.settings, f.name, schedule)

    @classmethod
    def refuse_draws(cls, config) -> None:
        """A shared setting drawn per actor that this algorithm keeps one for all: ValueError
        naming it."""
        for f in dataclasses.fields(AgentConfig):
            if isinstance(getattr(config, f.name, None), Draw) and f.name not in cls.actor_only:
                raise ValueError(
                    f"{f.name}: {cls.name} takes one value for every actor, not a per-actor"
                    f" distribution ({getattr(config, f.name).toml()})"
                )

    @property
    def parameter_sync(self) -> ParameterSync:
        """When its actors take new parameters (a property: it may follow the settings)."""
        return ParameterSync()

    def check(self) -> None:  # noqa: B027 (a hook: most builders have nothing to refuse)
        """Refuses an env or settings the algorithm cannot run (ValueError naming the setting)."""

    @classmethod
    def presets(cls, env_id: str) -> dict[str, dict[str, Any]]:
        """Tuned settings for an env, by config table (`learner`, `actor`, ..., and the
        algorithm's own name): what local mode starts with before the user's file."""
        return {}

    @abstractmethod
    def columns(self) -> list[Column]:
        """The columns of the items actors insert and the learner samples."""

    def tables(self) -> list[ReplayTableConfig]:
        """The replay tables the algorithm needs, by name (local mode and `apexrl tables`
        configure the replay from them; the learner refuses a replay whose tables differ).
        Default: adder's table (algorithms/tables.py's TABLE), from the table settings the
        algorithm's Settings inherit."""
        return [self.settings.table(TABLE, self.columns())]

    @abstractmethod
    def exploration(self, index: int, count: int) -> float:
        """The exploration parameter of place `index` among `count` live actors."""

    @abstractmethod
    def adders(self, num_envs: int, policy: Policy) -> list[Adder]:
        """Every adder an actor feeds its steps to, one table each (Adder.table); the first
        paces the actor (its items go first, its parameter changes)."""

    def table_columns(self, table: str) -> list[Column]:
        """The columns of `table`'s items (default: columns(), those of the first adder's table)."""
        return self.columns()

    @abstractmethod
    def policy(self) -> Policy: ...

    @abstractmethod
    def dataset(self) -> Dataset: ...

    def auxiliary_datasets(self) -> list[Dataset]:
        """Tables the learner samples beside dataset()'s, a batch of each per update, their
        columns under "<table>/<column>" in Learning.update's batch; never prioritized."""
        return []

    @abstractmethod
    def learning(self, config, device: torch.device) -> Learning:
        """config: the learner's settings (learning rate, batch size, ...)."""


def prefixed(arrays: dict[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    """The arrays under prefix/, with the prefix taken off."""
    return {k[len(prefix) + 1 :]: v for k, v in arrays.items() if k.startswith(prefix + "/")}


def hidden_sizes(text: str, default: str = "128,128") -> tuple[int, ...]:
    """'128,128' -> (128, 128): the `hidden` setting (empty: the algorithm's `default`)."""
    return tuple(int(h) for h in (text.strip() or default).split(",") if h.strip())
