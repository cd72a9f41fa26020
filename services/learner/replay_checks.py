"""What the learner checks of the replay it trains from: that a table is the one the algorithm
declares, and that sampled batches carry the algorithm's columns (another algorithm's actors, or
a table filled for another env, would otherwise fail somewhere deep in the loss)."""

from collections.abc import Iterable, Mapping

import numpy as np

from apexrl.algorithms.base import Builder
from apexrl.algorithms.columns import Column
from apexrl.common.codec import Packed
from apexrl.common.tensors import codec_to_proto, dtype_from_proto
from apexrl.v1 import replay_pb2


def check_columns(
    builder: Builder, columns: Mapping[str, np.ndarray | Packed], declared: Iterable[Column]
) -> None:
    """A sampled batch must carry the `declared` columns of the builder's algorithm."""
    got = {
        name: (np.dtype(a.dtype), tuple(a.item_shape if isinstance(a, Packed) else a.shape[1:]))
        for name, a in columns.items()
    }
    want = {c.name: (c.dtype, c.shape) for c in declared}
    if got != want:
        raise ValueError(f"replay columns {got} are not algorithm {builder.name}'s {want}")


def check_table(builder: Builder, info: replay_pb2.TableInfo) -> None:
    """The replay's table must be the one the algorithm declares (sampler, remover,
    max_times_sampled, rate limiter, the priority exponent, and the columns once it has a
    signature): a mismatch is a configuration error naming the table and the setting. The
    sizes and the rate limiter's ratio are the replay's to tune (local mode splits sizes
    over its shards)."""
    want = {t.name: t for t in builder.tables()}[info.name]
    got = {
        "sampler": info.sampler,
        "remover": info.remover,
        "max_times_sampled": info.max_times_sampled,
        "rate_limiter": info.rate_limiter,
    }
    if want.sampler == "prioritized":
        got["alpha"] = info.alpha
    for setting, value in got.items():
        if value != getattr(want, setting):
            raise ValueError(
                f"replay table {info.name!r}: {setting} is {value!r}, algorithm"
                f" {builder.name} needs {getattr(want, setting)!r} (make the"
                " replay's tables from the algorithm's settings: `apexrl tables`)"
            )
    columns = {
        (c.name, dtype_from_proto(c.dtype, c.name), tuple(c.shape), c.codec) for c in info.signature
    }
    needed = {
        (c.name, np.dtype(c.dtype), tuple(c.shape), codec_to_proto(c.codec))
        for c in builder.table_columns(info.name)
    }
    if columns and columns != needed:
        raise ValueError(
            f"replay table {info.name!r}: signature {want.signature!r} is what algorithm"
            f" {builder.name} inserts; the table's columns differ"
        )
