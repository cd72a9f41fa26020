"""Neural Episodic Control's builder (Pritzel et al. 2017), distributed as Ape-X distributes
DQN: epsilon-greedy actors on a ladder write N-step transitions to one uniform table; the
learner writes N-step Q targets to a DND per action and trains the embedding and the DNDs end
to end; actors act on the published embedding and DNDs."""

from dataclasses import dataclass

import numpy as np

from apexrl.algorithms.adders.nstep import NStepAdder
from apexrl.algorithms.base import EPSILON, Adder, Builder, MetricNames, Policy, hidden_sizes
from apexrl.algorithms.columns import Column, nstep_columns
from apexrl.algorithms.exploration import epsilon_ladder
from apexrl.algorithms.tables import TABLE, UniformTable, redefault
from apexrl.config import option


@dataclass
class Settings(UniformTable):
    """[nec]: Neural Episodic Control's settings."""

    n_step: int = option(
        10, "N of the N-step Q targets the actors' transitions give", per_actor="draw"
    )
    dnd_capacity: int = option(5_000, "keys each action's DND holds (replaced least recently used)")
    neighbours: int = option(50, "k: the nearest keys a lookup weighs")
    delta: float = option(1e-3, "the kernel's delta: w = 1/(squared distance + delta)")
    alpha: float = option(0.1, "tabular write rate of a key already held: v += alpha (y - v)")
    key_size: int = option(32, "the embedding's (the keys') width")
    refresh_versions: int = option(
        8,
        "a published DND row is at most this many versions older than the learner's: each"
        " version carries the rows written since the one before and 1/refresh_versions of the"
        " others, in turn (1: every row, every version)",
    )
    capacity: int = redefault(UniformTable, "capacity", 100_000)


class NECBuilder(Builder):
    name = "nec"
    Settings = Settings
    actor_only = ("gamma",)  # the N-step discounts travel in the transitions
    metrics = MetricNames(
        *EPSILON,
        loss_help="Importance-weighted squared error to the N-step Q targets of the last update.",
        figures={
            "q_mean": "Mean Q(s, a) of the last batch, looked up in the DNDs.",
            "dnd_size": "Keys the DNDs hold, all actions together.",
        },
    )

    @classmethod
    def presets(cls, env_id: str) -> dict:
        # Each transition sampled about 16 times, the rate limiter holding the actors back: NEC
        # is for data efficiency (on CartPole 4 times took more env steps: docs/benchmarks.md).
        return {"nec": {"samples_per_insert": 16.0, "error_buffer": 8_000.0}}

    def check(self) -> None:
        s = self.settings
        if not self.spec.discrete:
            raise ValueError(f"algorithm: nec needs a Discrete action space, {self.spec.env_id}")
        if s.dnd_capacity < 1:
            raise ValueError(f"dnd_capacity: must be >= 1, got {s.dnd_capacity}")
        if not 1 <= s.neighbours <= s.dnd_capacity:
            raise ValueError(
                f"neighbours: must be in [1, dnd_capacity = {s.dnd_capacity}], got {s.neighbours}"
            )
        for name in ("n_step", "key_size", "capacity", "refresh_versions"):
            if getattr(s, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(s, name)}")
        if s.delta <= 0:
            raise ValueError(f"delta: must be > 0, got {s.delta}")
        if not 0 < s.alpha <= 1:
            raise ValueError(f"alpha: must be in (0, 1], got {s.alpha}")

    def columns(self) -> list[Column]:
        return nstep_columns(self.spec, np.dtype(np.int64))

    def exploration(self, index: int, count: int) -> float:
        return epsilon_ladder(index, count)

    def adders(self, num_envs: int, policy: Policy) -> list[Adder]:
        return [NStepAdder(num_envs, self.settings.n_step, self.config.gamma, table=TABLE)]

    def dataset(self):
        from apexrl.algorithms.datasets import Stream

        return Stream(TABLE, prioritized=False)

    def network(self):
        from apexrl.algorithms.nec.networks import NECNetwork

        s, spec = self.settings, self.spec
        dnd = {"capacity": s.dnd_capacity, "neighbours": s.neighbours, "delta": s.delta}
        dnd["alpha"] = s.alpha
        return NECNetwork(
            spec.obs_shape,
            spec.obs_dtype,
            spec.num_actions,
            hidden_sizes(self.config.hidden),
            s.key_size,
            dnd,
        )

    def policy(self):
        from apexrl.algorithms.nec.acting import NECPolicy

        return NECPolicy(self.network())

    def learning(self, config, device):
        from apexrl.algorithms.nec.learning import NECLearning

        return NECLearning(self.network, config, self.settings, device)
