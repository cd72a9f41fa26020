"""A table's checks of what it is given: its settings when it is made (ValueError), and each
insert and sample request before anything changes (InvalidArgument, or FailedPrecondition where
a queue's batches could wait for each other forever), each naming the field and the value."""

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from apexrl.common.codec import Packed
from apexrl.common.errors import InvalidArgument
from apexrl.replay.composition import check_composition
from apexrl.replay.priorities import check_priorities
from apexrl.replay.rate_limiters import QueueLimiter, RateLimiter
from apexrl.replay.signature import check_batch, check_name
from apexrl.replay.validation import is_int, is_real

if TYPE_CHECKING:  # the table imports this module
    from apexrl.replay.table import Table


def check_settings(
    name: str,
    capacity: int,
    sampler: str,
    remover: str,
    max_times_sampled: int,
    alpha: float,
    rate_limiter: RateLimiter | QueueLimiter,
    max_batch_size: int,
) -> None:
    """ValueError naming the setting unless a table can be made of these."""
    check_name(name, "table name")
    if not is_int(capacity) or capacity < 1:
        raise ValueError(f"capacity must be an integer >= 1, got {capacity!r}")
    if not is_real(alpha) or not math.isfinite(alpha) or alpha < 0:
        raise ValueError(f"alpha must be finite and >= 0, got {alpha!r}")
    if not isinstance(rate_limiter, RateLimiter | QueueLimiter):
        raise ValueError(
            f"rate_limiter must be a RateLimiter or QueueLimiter, got {rate_limiter!r}"
        )
    check_composition(name, sampler, remover, max_times_sampled, rate_limiter.kind)
    if isinstance(rate_limiter, RateLimiter) and capacity < rate_limiter.min_size_to_sample:
        raise ValueError(
            f"capacity {capacity} < min_size_to_sample {rate_limiter.min_size_to_sample}:"
            " the table could never be sampled"
        )
    if not is_int(max_batch_size) or max_batch_size < 1:
        raise ValueError(f"max_batch_size must be an integer >= 1, got {max_batch_size!r}")


def _item_limit(table: "Table") -> int:
    return min(table.capacity, table.max_batch_size)


def check_insert(
    table: "Table",
    columns: Mapping[str, np.ndarray | Packed],
    priorities: np.ndarray | None,
    largest_sample: int,
) -> int:
    """An insert's number of items, checked against `table` and the largest sample batch
    requested of it so far."""
    n = check_batch(columns, table.signature, table.name)
    if n == 0:
        raise InvalidArgument("batch", "empty batch (0 items)")
    if n > _item_limit(table):
        raise InvalidArgument(
            "batch",
            f"{n} items exceed min(capacity {table.capacity},"
            f" max_batch_size {table.max_batch_size})",
        )
    if priorities is not None:
        check_priorities(priorities, n, "one per item")
    table.rate_limiter.check_batches(table.name, table.capacity, "batch", n, largest_sample)
    return n


def check_sample(table: "Table", batch_size: int, beta: float, largest_insert: int) -> int:
    """A sample request's batch size, checked against `table` and the largest insert batch
    requested of it so far."""
    limit = _item_limit(table)
    if not is_int(batch_size) or not 1 <= batch_size <= limit:
        raise InvalidArgument(
            "batch_size",
            f"must be an integer in [1, {limit}] (min of capacity"
            f" {table.capacity} and max_batch_size {table.max_batch_size}), got {batch_size!r}",
        )
    # The comparison is False for NaN, so NaN is rejected too.
    if not is_real(beta) or not 0.0 <= beta <= 1.0:
        raise InvalidArgument("beta", f"must be in [0, 1], got {beta!r}")
    b = int(batch_size)
    table.rate_limiter.check_batches(table.name, table.capacity, "batch_size", b, largest_insert)
    return b
