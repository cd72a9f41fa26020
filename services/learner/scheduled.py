"""The learner's scheduled settings (schedules.py): before every update each is set to its
value at the learner's step, in the config or the algorithm's settings where the update step
reads it, and shown as a gauge.

- `learning_rate` moves every optimizer's learning rate (Learning.optimizers()) by its ratio
  to the schedule's start, so an algorithm's second rate keeps its proportion to the first.
- `beta`: batches are sampled with beta 1 and their weights raised to the scheduled beta
  (w_i = (min_batch P / P(i))^beta, so w(beta) = w(1)^beta exactly), so the stream that
  samples them needs no new request when beta moves.

The step is the update count, restored from a checkpoint: a resumed run continues each
schedule where it was.
"""

import dataclasses

import torch

from apexrl.schedules import Schedule


class ScheduledSettings:
    def __init__(self, config, settings, optimizers: list[torch.optim.Optimizer], gauge):
        """config: the learner's (LearnerConfig); settings: the algorithm's; optimizers: the
        learning's, as made (their learning rates are the schedule's start); gauge: a Gauge
        labelled by setting."""
        self.scheduled = [
            (owner, f.name, getattr(owner, f.name))
            for owner in (config, settings)
            if owner is not None
            for f in dataclasses.fields(owner)
            if isinstance(getattr(owner, f.name), Schedule)
        ]
        names = {name for _, name, _ in self.scheduled}
        self.beta = next((s for o, n, s in self.scheduled if o is config and n == "beta"), None)
        self.rate = next(
            (s for o, n, s in self.scheduled if o is config and n == "learning_rate"), None
        )
        self.groups = [(g, g["lr"]) for o in optimizers for g in o.param_groups]
        self.gauge = gauge
        for name in names:
            gauge.labels(setting=name)

    @property
    def sampling_beta(self) -> float | None:
        """The beta to sample with when beta is scheduled (None: the config's)."""
        return 1.0 if self.beta is not None else None

    def apply(self, step: int) -> None:
        """Every scheduled setting at `step` (updates done)."""
        for owner, name, schedule in self.scheduled:
            value = schedule.value(step)
            setattr(owner, name, value)
            self.gauge.labels(setting=name).set(value)
        if self.rate is not None:
            start, now = self.rate.value(0), self.rate.value(step)
            for group, base in self.groups:
                group["lr"] = base * now / start if start else now

    def weights(self, weights: torch.Tensor, step: int) -> torch.Tensor:
        """A batch's importance weights at the scheduled beta (sampled with beta 1)."""
        if self.beta is None:
            return weights
        return weights.pow(self.beta.value(step))
