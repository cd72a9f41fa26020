"""A replay table's settings, defined once. An algorithm's Settings inherit one of these (its
`[<algorithm>]` table and flags: `capacity`, `priority_exponent`, ...), and `table()` turns
them into the ReplayTableConfig that local mode writes, `apexrl tables` renders into the
Kubernetes configs, and the learner holds the replay's tables to at start-up.

- `PrioritizedTable`: Ape-X's (dqn, rainbow, dpg, r2d2): prioritized sampling, FIFO eviction,
  a ratio rate limiter.
- `UniformTable`: the same with uniform sampling (nec).
- `QueueTable`: the on-policy algorithms' (impala, ppo, unreal): each item sampled once, oldest
  first; actors wait while it is full.
"""

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from apexrl.algorithms.columns import Column
from apexrl.config import ReplayTableConfig, option

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

# The name of the table an algorithm's actors write and its learner reads (a replay started
# with flat settings serves one table of this name).
TABLE = "default"


def redefault(settings: "type[DataclassInstance]", name: str, default: Any) -> Any:
    """Field `name` of `settings` with another default and the same help (an algorithm whose
    tables are sized otherwise)."""
    return option(default, settings.__dataclass_fields__[name].metadata["help"])


@dataclass
class QueueTable:
    capacity: int = option(64, "items the queue holds (per shard); actors wait while it is full")

    def table(self, name: str, columns: list[Column]) -> ReplayTableConfig:
        return ReplayTableConfig(
            name=name,
            capacity=self.capacity,
            sampler="fifo",
            remover="none",
            max_times_sampled=1,
            rate_limiter="queue",
            signature=signature(columns),
        )


@dataclass
class UniformTable:
    capacity: int = option(1_000_000, "items the replay table holds (per shard)")
    min_size_to_sample: int = option(1000, "sampling waits until the table holds this many")
    samples_per_insert: float = option(
        0.0, "rate limiter: sampled items per inserted one (0: no ratio)"
    )
    error_buffer: float = option(
        0.0, "rate limiter: allowed deviation from samples_per_insert, in samples"
    )

    def table(self, name: str, columns: list[Column]) -> ReplayTableConfig:
        return ReplayTableConfig(
            name=name,
            capacity=self.capacity,
            sampler="uniform",
            remover="fifo",
            rate_limiter="ratio",
            min_size_to_sample=self.min_size_to_sample,
            samples_per_insert=self.samples_per_insert,
            error_buffer=self.error_buffer,
            signature=signature(columns),
        )


@dataclass
class PrioritizedTable(UniformTable):
    priority_exponent: float = option(
        0.6, "the table's alpha: P(i) = p_i^alpha / sum p^alpha (0: uniform)"
    )

    def table(self, name: str, columns: list[Column]) -> ReplayTableConfig:
        uniform = super().table(name, columns)
        return dataclasses.replace(uniform, sampler="prioritized", alpha=self.priority_exponent)


def signature(columns: list[Column]) -> str:
    """The replay's --signature of these columns."""
    return ",".join(column.spec() for column in columns)
