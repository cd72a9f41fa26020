"""When a table admits inserts and samples: Reverb's rate limiters, as small value objects.

A limiter sees the table's counters (inserts, samples, both in items) and its size, and says
whether an insert or a sample may go ahead now; the server holds the call until it may, bounded
by the call's deadline. Its `kind` is the `rate_limiter` setting's value.
"""

import math
from dataclasses import dataclass

from apexrl.common.errors import FailedPrecondition
from apexrl.replay.validation import is_int, is_real


@dataclass(frozen=True)
class RateLimiter:
    """Reverb's SampleToInsertRatio limiter, adapted to batches so it can never deadlock.

    With diff = inserts * samples_per_insert - samples (samples counted in items):

    - sampling needs size >= min_size_to_sample and, if samples_per_insert > 0,
      diff > min_diff = samples_per_insert * min_size_to_sample - error_buffer;
    - inserting needs, if samples_per_insert > 0,
      diff < max_diff = samples_per_insert * min_size_to_sample + error_buffer.

    A batch is admitted when the limiter is inside its window *before* the batch, and
    may overshoot the window by its own size. Reverb instead requires the state after
    the batch to be inside the window, which deadlocks any batch larger than the window
    (2 * error_buffer): both sides wait forever. Here, whenever a caller cannot insert,
    diff >= max_diff > min_diff, and inserts > min_size_to_sample (so size >=
    min_size_to_sample, as capacity >= min_size_to_sample): a sampler can proceed.
    Symmetrically, whenever sampling is blocked, inserting is allowed. So some side can
    always move, whatever the batch sizes.

    samples_per_insert == 0 disables the ratio: only min_size_to_sample applies.
    """

    kind = "ratio"  # the rate_limiter setting's name for it (a class attribute, not a field)

    min_size_to_sample: int = 1
    samples_per_insert: float = 0.0
    error_buffer: float = 0.0

    def __post_init__(self) -> None:
        m, spi, eb = self.min_size_to_sample, self.samples_per_insert, self.error_buffer
        if not is_int(m) or m < 1:
            raise ValueError(f"min_size_to_sample must be an integer >= 1, got {m!r}")
        if not is_real(spi) or not math.isfinite(spi) or spi < 0:
            raise ValueError(f"samples_per_insert must be finite and >= 0, got {spi!r}")
        if not is_real(eb) or not math.isfinite(eb) or eb < 0:
            raise ValueError(f"error_buffer must be finite and >= 0, got {eb!r}")
        if spi > 0 and eb <= 0:
            raise ValueError(
                f"error_buffer must be > 0 when samples_per_insert > 0, got {eb!r}"
                " (a zero-width window would let neither side move)"
            )
        object.__setattr__(self, "min_size_to_sample", int(m))
        object.__setattr__(self, "samples_per_insert", float(spi))
        object.__setattr__(self, "error_buffer", float(eb))

    def check_batches(self, table: str, capacity: int, field: str, batch: int, other: int) -> None:
        """Nothing: whatever the batch sizes, some side can move (see above)."""

    def _diff(self, inserts: int, samples: int) -> float:
        return inserts * self.samples_per_insert - samples

    def can_insert(self, inserts: int, samples: int) -> bool:
        if self.samples_per_insert == 0:
            return True
        max_diff = self.samples_per_insert * self.min_size_to_sample + self.error_buffer
        return self._diff(inserts, samples) < max_diff

    def can_sample(self, inserts: int, samples: int, size: int) -> bool:
        if size < self.min_size_to_sample:
            return False
        if self.samples_per_insert == 0:
            return True
        min_diff = self.samples_per_insert * self.min_size_to_sample - self.error_buffer
        return self._diff(inserts, samples) > min_diff

    def to_json(self) -> dict:
        return {
            "min_size_to_sample": self.min_size_to_sample,
            "samples_per_insert": self.samples_per_insert,
            "error_buffer": self.error_buffer,
        }


@dataclass(frozen=True)
class QueueLimiter:
    """Reverb's Queue limiter: inserts wait while the table has no room for the whole batch,
    samples until the table holds the whole batch.

    Both conditions are the table's own (remover "none" waits for room, a distinct batch for
    items), so the limiter adds none. What it does add is the promise that no pair of batch
    sizes deadlocks: an insert of n waits while size > capacity - n and a sample of B while
    size < B, so both wait at once only if n + B > capacity + 1. The table refuses a batch that
    would make such a pair with a batch already requested (FAILED_PRECONDITION naming it).
    """

    kind = "queue"

    def check_batches(self, table: str, capacity: int, field: str, batch: int, other: int) -> None:
        """FailedPrecondition naming the field if this batch (field "batch" for an insert,
        "batch_size" for a sample) and the largest batch of the other side requested before
        (`other`) could wait for each other forever."""
        if batch + other > capacity + 1:
            side = "sample" if field == "batch" else "insert"
            raise FailedPrecondition(
                field,
                f"table {table!r} is a queue of capacity {capacity}: {batch} items with"
                f" the {side} batches of {other} requested before could wait for each other"
                f" forever (an insert batch plus a sample batch must be <= capacity + 1 ="
                f" {capacity + 1})",
            )

    def can_insert(self, inserts: int, samples: int) -> bool:
        return True

    def can_sample(self, inserts: int, samples: int, size: int) -> bool:
        return size >= 1

    def to_json(self) -> dict:
        return {"kind": self.kind}


# The rate_limiter setting's values, each the limiter it names.
RATE_LIMITERS = {limiter.kind: limiter for limiter in (RateLimiter, QueueLimiter)}
