"""How a table's strategies fit together: its sampler, remover, max_times_sampled and rate
limiter settings, checked once, when the table is made.

Keys are insertion sequence numbers with slot = key % capacity, so an item that leaves frees
its slot and only the key that maps there can use it again. With remover "none" an insert
waits while any slot of its keys still holds an item: capacity bounds the span of keys held
(newest - oldest + 1), which is exactly "the table is full" when items leave in key order.
Only the fifo sampler removes in key order, so remover "none" takes sampler "fifo": any other
order leaves holes that inserts cannot use, and a batch could wait forever for items that have
no room to arrive. Items leave only after max_times_sampled samples, and only the queue limiter
never holds samples back while inserts wait for room; the queue limiter in turn needs a table
that holds its inserts instead of evicting unread items.
"""

import numpy as np

from apexrl.replay.rate_limiters import RATE_LIMITERS
from apexrl.replay.removers import REMOVERS
from apexrl.replay.samplers import SAMPLERS


def check_composition(
    table: str, sampler: str, remover: str, max_times_sampled: int, rate_limiter: str
) -> None:
    """ValueError naming the table and the setting if these cannot work together."""
    where = f"table {table!r}"
    if sampler not in SAMPLERS:
        raise ValueError(f"{where}: sampler {sampler!r} is not one of {', '.join(SAMPLERS)}")
    if remover not in REMOVERS:
        raise ValueError(f"{where}: remover {remover!r} is not one of {', '.join(REMOVERS)}")
    if rate_limiter not in RATE_LIMITERS:
        raise ValueError(
            f"{where}: rate_limiter {rate_limiter!r} is not one of {', '.join(RATE_LIMITERS)}"
        )
    k = max_times_sampled
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 0:
        raise ValueError(f"{where}: max_times_sampled must be an integer >= 0, got {k!r}")
    if remover == "none" and k == 0:
        raise ValueError(
            f"{where}: remover 'none' with max_times_sampled 0: items would never leave, so the"
            " first full table would hold every insert forever (set max_times_sampled >= 1)"
        )
    if remover == "none" and sampler != "fifo":
        raise ValueError(
            f"{where}: remover 'none' needs sampler 'fifo', got {sampler!r}: slots are key %"
            " capacity, so items sampled out of insertion order leave holes no insert can use"
            " and a batch could wait forever"
        )
    if remover == "none" and rate_limiter != "queue":
        raise ValueError(
            f"{where}: remover 'none' needs rate_limiter 'queue', got {rate_limiter!r}: the"
            " ratio limiter can hold samples while inserts wait for room"
        )
    if rate_limiter == "queue" and remover != "none":
        raise ValueError(
            f"{where}: rate_limiter 'queue' needs remover 'none', got {remover!r}: with"
            " eviction a full queue would drop unread items instead of holding the insert"
        )
