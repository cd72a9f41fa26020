"""How a learner reads its table: the three datasets builders choose from (Acme's make_dataset).

- `Stream`: a prioritized (or uniform) replay table, sampled by a server stream that runs
  ahead of the update step; priorities are written back.
- `Queue`: a queue table (each item sampled once, oldest first): one Sample call of exactly a
  batch each time the learner asks, never a stream (see `exact_batches`).
- `FreshQueue`: a queue whose items must be acted by the learner's newest version (on-policy):
  batches are sampled in the training thread, older items dropped and counted, and the learner
  publishes a version after every update (the actors wait for it).

A builder's auxiliary datasets (Builder.auxiliary_datasets: prefetched, never prioritized) give
a batch each to every update besides the main dataset's.

The learner calls `batches` for raw sampled batches, decodes them, and passes each decoded
batch (columns, weights, keys) through `gather`, which returns the batch to train on, or None
while it is still gathering one.
"""

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc
import numpy as np
import torch


@dataclass
class Dataset:
    """What every dataset declares; `batches` yields the replay's sampled batches."""

    table: str  # the table the learner samples and writes priorities to
    prioritized: bool = True  # write priorities back
    prefetch: bool = True  # sampled ahead of the update step in a thread of the learner's
    publish_every_update: bool = False
    batch_size: int = 0  # items per batch (0: the learner's batch_size)

    def batches(self, replay, batch_size: int, beta: float, stop) -> Iterator:
        raise NotImplementedError

    def gather(self, item, version: int) -> tuple[tuple | None, int]:
        """(the batch to train on or None, items dropped)."""
        return item, 0


@dataclass
class Stream(Dataset):
    def batches(self, replay, batch_size: int, beta: float, stop) -> Iterator:
        return replay.sample_stream(batch_size, beta)


@dataclass
class Queue(Dataset):
    prioritized: bool = False

    def batches(self, replay, batch_size: int, beta: float, stop) -> Iterator:
        return exact_batches(replay, lambda: batch_size, beta, stop)


@dataclass
class FreshQueue(Queue):
    """Gathers the newest version's items over sampled batches until there are batch_size.

    The training thread samples them itself (prefetch False), each call asking for exactly the
    items the batch still lacks. Sampling ahead, or a full batch_size, waits on items no actor
    writes until the learner publishes whenever older items fill part of a batch (an actor that
    acted again while it waited): the learner then stalls until the actors' wait runs out."""

    prefetch: bool = False
    publish_every_update: bool = True

    def __post_init__(self) -> None:
        self._gathered: list = []
        self._batch_size = 0

    def batches(self, replay, batch_size: int, beta: float, stop) -> Iterator:
        self._batch_size = batch_size
        return exact_batches(replay, self._missing, beta, stop)

    def _missing(self) -> int:
        return self._batch_size - sum(len(keys) for *_, keys in self._gathered)

    def gather(self, item, version: int) -> tuple[tuple | None, int]:
        columns, weights, keys = item
        current = (columns["version"] == version).cpu().numpy()
        if current.any():
            index = torch.from_numpy(np.flatnonzero(current)).to(weights.device)
            kept = ({k: v[index] for k, v in columns.items()}, weights[index], keys[current])
            self._gathered.append(kept)
        dropped = int((~current).sum())
        if self._missing() > 0:
            return None, dropped
        parts, self._gathered = self._gathered, []
        columns = {k: torch.cat([c[k] for c, _, _ in parts]) for k in parts[0][0]}
        weights = torch.cat([w for _, w, _ in parts])
        return (columns, weights, np.concatenate([k for *_, k in parts])), dropped


def exact_batches(replay, size: Callable[[], int], beta: float, stop) -> Iterator:
    """A queue table's batches of size() items, one Sample call each, made when the consumer
    asks for the next. A stream would keep sampling into gRPC's buffers while the learner
    trains; sampled items leave the queue, so a slow learner would empty it (the actors, no
    longer held back, race ahead) and lose every buffered batch when it stops."""
    while not stop.is_set():
        try:
            batch = replay.sample(size(), beta)
        except grpc.RpcError as err:
            if stop.is_set():  # the stop cancelled it: a stop, not a failure
                return
            if err.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                raise
            continue  # the queue lacked a batch until the deadline: again
        yield batch
