"""The replay's Prometheus metrics: the tables' state, read at scrape time, and what the
server observes (rate-limiter waits, sample ages, checkpoints).

Sizes, counters and the priority histogram are collected from the tables when scraped, so they
are never kept twice; sample ages are counted as samples are served.
"""

import time

import numpy as np
import prometheus_client
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)

from apexrl.replay.table import Table

# Sample age (inserts since an item was written) buckets: powers of 4 up to 4^12 ~ 16.8 M.
AGE_BUCKETS = np.array([4.0**k for k in range(13)])
# Stored priority buckets, log-spaced.
PRIORITY_BUCKETS = np.array(
    [0.0, 1e-4, 1e-3, 1e-2, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0, 1e3]
)


class ReplayMetrics:
    """Prometheus view of the tables: state is read at scrape time, never kept twice."""

    def __init__(self, registry: prometheus_client.CollectorRegistry, tables: dict[str, Table]):
        self.tables = tables
        self.age_counts = {name: np.zeros(len(AGE_BUCKETS) + 1, np.int64) for name in tables}
        self.age_sums = dict.fromkeys(tables, 0.0)
        self.wait_seconds = prometheus_client.Histogram(
            "apexrl_replay_rate_limiter_wait_seconds",
            "Time an insert or sample waited for the rate limiter.",
            ["table", "operation"],
            buckets=(0.001, 0.01, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=registry,
        )
        self.checkpoint_seconds = prometheus_client.Gauge(
            "apexrl_replay_checkpoint_duration_seconds",
            "Duration of the last checkpoint.",
            registry=registry,
        )
        self.checkpoint_bytes = prometheus_client.Gauge(
            "apexrl_replay_checkpoint_size_bytes", "Size of the last checkpoint.", registry=registry
        )
        self.checkpoint_time = prometheus_client.Gauge(
            "apexrl_replay_checkpoint_timestamp_seconds",
            "Unix time the last checkpoint was durable (0: none yet).",
            registry=registry,
        )
        self.checkpoint_failures = prometheus_client.Counter(
            "apexrl_replay_checkpoint_failures",
            "Checkpoints that failed to write.",
            registry=registry,
        )
        age = prometheus_client.Gauge(
            "apexrl_replay_checkpoint_age_seconds",
            "Seconds since the last durable checkpoint (-1: none yet).",
            registry=registry,
        )
        self.last_checkpoint = 0.0  # the timestamp, kept beside the gauge for the age
        age.set_function(lambda: time.time() - t if (t := self.last_checkpoint) else -1)
        self.shard = prometheus_client.Gauge(
            "apexrl_replay_shard",
            "This replay's shard id (the top bits of its keys).",
            registry=registry,
        )
        registry.register(self)

    def observe_sample(self, table: Table, keys: np.ndarray) -> None:
        ages = (table.inserts - 1 - keys).astype(np.float64)
        self.age_counts[table.name] += np.bincount(
            np.searchsorted(AGE_BUCKETS, ages, side="left"), minlength=len(AGE_BUCKETS) + 1
        )
        self.age_sums[table.name] += float(ages.sum())

    def collect(self):
        gauges = {
            "size": ("Items stored.", lambda t: t.size),
            "stored_bytes": (
                "Bytes the stored items take (columns, compressed frames, keys, priorities,"
                " sum tree).",
                lambda t: t.stored_bytes,
            ),
            "capacity": ("Items the table can hold.", lambda t: t.capacity),
            "total_priority": ("Sum of p^alpha over stored items.", lambda t: t.total_priority),
            "max_priority": ("Largest priority set so far.", lambda t: t.max_priority),
        }
        for name, (doc, get) in gauges.items():
            family = GaugeMetricFamily(f"apexrl_replay_{name}", doc, labels=["table"])
            for table in self.tables.values():
                family.add_metric([table.name], float(get(table)))
            yield family
        counters = {
            "inserts": ("Items inserted.", "inserts"),
            "samples": ("Items sampled (a batch of B counts B).", "samples"),
            "removed": (
                "Items that left: evicted at capacity or sampled max_times_sampled times.",
                "removed",
            ),
            "priority_updates": ("Priorities set by UpdatePriorities.", "priority_updates"),
            "stale_priority_updates": (
                "Updates ignored: item overwritten.",
                "stale_priority_updates",
            ),
        }
        for name, (doc, attr) in counters.items():
            family = CounterMetricFamily(f"apexrl_replay_{name}", doc, labels=["table"])
            for table in self.tables.values():
                family.add_metric([table.name], float(getattr(table, attr)))
            yield family
        priorities = GaugeHistogramMetricFamily(
            "apexrl_replay_priority", "Priorities of the stored items.", labels=["table"]
        )
        ages = HistogramMetricFamily(
            "apexrl_replay_sample_age",
            "Age of sampled items, in inserts since the item was written.",
            labels=["table"],
        )
        for table in self.tables.values():
            stored = table.stored_priorities()
            counts = np.bincount(
                np.searchsorted(PRIORITY_BUCKETS, stored, side="left"),
                minlength=len(PRIORITY_BUCKETS) + 1,
            )
            priorities.add_metric(
                [table.name], _buckets(PRIORITY_BUCKETS, counts), float(stored.sum())
            )
            age_counts = self.age_counts[table.name]
            ages.add_metric(
                [table.name], _buckets(AGE_BUCKETS, age_counts), self.age_sums[table.name]
            )
        yield priorities
        yield ages


def _buckets(bounds: np.ndarray, counts: np.ndarray) -> list[tuple[str, float]]:
    """Cumulative (le, count) pairs from per-bucket counts (last count is the +Inf overflow)."""
    cumulative = np.cumsum(counts)
    pairs = [(repr(float(b)), float(c)) for b, c in zip(bounds, cumulative[:-1], strict=True)]
    return [*pairs, ("+Inf", float(cumulative[-1]))]
