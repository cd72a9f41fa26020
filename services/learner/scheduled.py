"""The learner's settings that may change during a run: those a schedule can move
(schedules.py; `option(..., schedule="updates")`), by their schedule or by a live change
(`apexrl set`, the SetSetting RPC). Before every update each is set to its value at the
learner's step, in the config or the algorithm's settings where the update step reads it,
and shown as a gauge.

- `learning_rate` moves every optimizer's learning rate (Learning.optimizers()) by its ratio
  to the rate the optimizers were made with, so an algorithm's second rate keeps its
  proportion to the first.
- `beta`: importance weights sampled at beta b0 become those of beta b as w(b0)^(b / b0)
  (w_i = (min_batch P / P(i))^b exactly), so the stream that samples them needs no new
  request when beta moves. A beta scheduled from the start is sampled at 1.

A live change replaces the setting's schedule by its new value from the next update on; the
changes travel in the learner's checkpoints (`live_settings`), so a resumed learner keeps
them. The step is the update count, restored from a checkpoint: a resumed run continues each
schedule where it was.
"""

import copy
import dataclasses
import logging
import math
import threading

import torch

from apexrl.common.errors import InvalidArgument
from apexrl.schedules import Schedule

log = logging.getLogger(__name__)


class ScheduledSettings:
    def __init__(self, config, builder, optimizers: list[torch.optim.Optimizer], gauge):
        """config: the learner's (LearnerConfig); builder: its algorithm (settings and check;
        None: the config's settings only); optimizers: the learning's, as made (their learning
        rates are the config's start); gauge: a Gauge labelled by setting."""
        self.config, self.builder = config, builder
        owners = [config] + ([builder.settings] if builder is not None else [])
        # Every setting that may change: the object that holds it, by name.
        self.owners = {
            f.name: owner
            for owner in owners
            for f in dataclasses.fields(owner)
            if f.metadata.get("schedule") == "updates"
        }
        self.values: dict[str, Schedule | float] = {
            name: getattr(owner, name)
            for name, owner in self.owners.items()
            if isinstance(getattr(owner, name), Schedule)
        }
        self.sampled_beta = 1.0 if "beta" in self.values else float(config.beta)
        self.first_rate = float(config.learning_rate)
        # Each param group's rate as made; the groups are looked up at each apply, as loading
        # an optimizer's state (a resume) puts new group dicts in place.
        self.optimizers = optimizers
        self.first_rates = [g["lr"] for o in optimizers for g in o.param_groups]
        self.live: dict[str, float] = {}  # the live changes, for the checkpoints
        self.changes = 0  # live changes made
        self.lock = threading.Lock()
        self.gauge = gauge
        for name in self.values:
            gauge.labels(setting=name)

    @property
    def sampling_beta(self) -> float:
        """The beta to sample with, whatever beta is now (weights() makes up the rest)."""
        return self.sampled_beta

    def change(self, name: str, value: float) -> float:
        """A live change, from the next update on; returns the value it replaces.
        InvalidArgument naming the setting for one that cannot change or a value it refuses."""
        owner = self.owners.get(name)
        if owner is None:
            raise InvalidArgument(
                name, f"cannot change during a run (settings that can: {', '.join(self.owners)})"
            )
        if not math.isfinite(value):
            raise InvalidArgument(name, f"must be finite, got {value}")
        self.refuse(name, value, owner)
        with self.lock:
            previous = getattr(owner, name)
            self.values[name] = float(value)
            self.live[name] = float(value)
            self.changes += 1
        log.info("live change: %s = %g (was %g)", name, value, previous)
        return float(previous)

    def refuse(self, name: str, value: float, owner) -> None:
        """InvalidArgument for a value the setting cannot take, checked on copies."""
        if name == "learning_rate" and value < 0:
            raise InvalidArgument(name, f"must be >= 0, got {value}")
        if name == "beta" and not 0 <= value <= 1:
            raise InvalidArgument(name, f"must be in [0, 1], got {value}")
        if name == "beta" and self.sampled_beta == 0:
            raise InvalidArgument(
                name,
                "the learner samples with beta 0 (every weight 1): start it with a beta above 0,"
                " or a schedule, to change it during the run",
            )
        if owner is self.config:
            return
        probe = copy.copy(self.builder)
        probe.settings = dataclasses.replace(owner, **{name: value})
        try:
            probe.check()
        except ValueError as err:  # "setting: why", as every check words it
            field, _, why = str(err).partition(": ")
            raise InvalidArgument(field, why) from None

    def apply(self, step: int) -> None:
        """Every scheduled or changed setting at `step` (updates done)."""
        with self.lock:
            values = list(self.values.items())
        for name, schedule in values:
            value = at(schedule, step)
            setattr(self.owners[name], name, value)
            self.gauge.labels(setting=name).set(value)
            if name == "learning_rate":
                groups = [g for o in self.optimizers for g in o.param_groups]
                for group, base in zip(groups, self.first_rates, strict=True):
                    group["lr"] = base * value / self.first_rate if self.first_rate else value

    def weights(self, weights: torch.Tensor, step: int) -> torch.Tensor:
        """A batch's importance weights at the current beta (sampled at sampled_beta)."""
        with self.lock:
            beta = self.values.get("beta")
        if beta is None:
            return weights
        return weights.pow(at(beta, step) / self.sampled_beta)


def at(value: Schedule | float, step: int) -> float:
    """A schedule's value at `step`; a live change's value whatever the step."""
    return value.value(step) if isinstance(value, Schedule) else value
