"""A replay table's settings (Reverb's vocabulary): the fields every `[[replay.tables]]` entry
and the replay's own flat settings share, and the entries' check (config.py re-exports them)."""

import dataclasses
from dataclasses import dataclass

from apexrl.config_parsing import convert, option


@dataclass
class TableFields:
    """A replay table's settings but its name, in Reverb's vocabulary (replay/samplers.py and the
    file comment of protos/apexrl/v1/replay.proto have the semantics): each `[[replay.tables]]`
    entry's keys, and the replay's flat settings of its one table when it has no entries."""

    capacity: int = option(1_000_000, "items the table holds; at capacity the remover acts")
    sampler: str = option(
        "prioritized",
        "prioritized, uniform, fifo (oldest first), lifo or balanced (half of a batch marked)",
    )
    remover: str = option(
        "fifo", "at capacity: fifo (evict the oldest) or none (inserts wait: a queue)"
    )
    max_times_sampled: int = option(0, "an item leaves after this many samples (0: never)")
    alpha: float = option(0.6, "priority exponent: P(i) = p_i^alpha / sum p^alpha; 0 is uniform")
    rate_limiter: str = option(
        "ratio",
        "ratio (min_size_to_sample, samples_per_insert, error_buffer) or queue (remover none:"
        " inserts wait for room, samples for a whole batch)",
    )
    min_size_to_sample: int = option(1000, "ratio: sampling waits until the table holds this many")
    samples_per_insert: float = option(
        0.0, "ratio: target sampled items per inserted item (0 disables the ratio)"
    )
    error_buffer: float = option(
        0.0, "ratio: allowed deviation from samples_per_insert, in samples"
    )
    signature: str = option(
        "",
        "column specs 'name:dtype:d0xd1,...' e.g. 'obs:float32:4,action:int64:' (empty: fixed by"
        " the first insert)",
    )


@dataclass
class ReplayTableConfig(TableFields):
    """One `[[replay.tables]]` entry: a named table."""

    name: str = option("", "table name (required, unique in the server)")


# The settings of a ratio rate limiter (a queue has none).
RATIO_ONLY = ("min_size_to_sample", "samples_per_insert", "error_buffer")


def replay_table_configs(entries: list[dict], where: str = "[[replay.tables]]"):
    """The `[[replay.tables]]` entries as ReplayTableConfig; ValueError naming the table and the
    key for an unknown key, a missing name, a name declared twice, or a ratio setting on a queue."""
    kinds = {f.name: f.type for f in dataclasses.fields(ReplayTableConfig)}
    tables: list[ReplayTableConfig] = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: entry {i} must be a table of settings, got {entry!r}")
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"{where}: entry {i} needs a name (a non-empty string)")
        for key in entry:
            if key not in kinds:
                raise ValueError(f"{where}: table {name!r} has unknown key {key!r}")
        if name in {t.name for t in tables}:
            raise ValueError(f"{where}: table {name!r} is declared twice")
        if entry.get("rate_limiter") == "queue":
            for key in RATIO_ONLY:
                if key in entry:
                    raise ValueError(
                        f"{where}: table {name!r}: {key} applies to rate_limiter 'ratio' only"
                    )
        values = {
            k: convert(v, kinds[k], f"{where}: table {name!r}: {k}") for k, v in entry.items()
        }
        tables.append(ReplayTableConfig(**values))
    return tables
