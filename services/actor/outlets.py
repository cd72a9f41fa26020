"""Where an actor's items go: each adder of the algorithm has an Outlet (its pending items,
its table's columns, its InsertBuffer), and every outlet takes every step the same way.

An InsertBuffer is a bounded FIFO of item batches drained into replay by a thread that never
gives up: it applies backpressure while replay is reachable and holds (then drops the oldest)
while it is not.
"""

import collections
import logging
import threading
import time

import numpy as np

from apexrl.algorithms.base import Step
from apexrl.algorithms.columns import pack
from apexrl.common import codec
from apexrl.common.backoff import Backoff
from apexrl.common.client import short_error
from apexrl.common.codec import Packed
from apexrl.common.memory import off_heap, release_free_memory
from apexrl.replay.client import Replay

log = logging.getLogger(__name__)

HELD_CHUNK_BYTES = 256 * 1024  # an outage's batches are held merged up to this size


class Outlet:
    """One adder's way to its table: the items it completes wait in `pending` until an insert
    batch is full (or at once, where the adder asks for it), then go to the buffer packed,
    with their initial priorities."""

    def __init__(self, adder, columns, buffer: "InsertBuffer", insert_batch: int, epsilon: float):
        self.adder, self.columns, self.buffer = adder, columns, buffer
        self.insert_batch, self.priority_epsilon = insert_batch, epsilon
        self.pending: list[dict[str, np.ndarray]] = []
        self.count = 0

    def add(self, step: Step) -> bool:
        """The step to the adder; whether it completed items."""
        items = self.adder.add(step)
        if items is None:
            return False
        self.pending.append(items)
        self.count += len(next(iter(items.values())))
        return True

    def flush_if_due(self, policy, metrics) -> None:
        if self.pending and (self.adder.insert_at_once or self.count >= self.insert_batch):
            self.flush(policy, metrics)

    def flush(self, policy, metrics) -> None:
        """The pending items to the buffer: one batch, initial priorities, packed."""
        batch = {k: np.concatenate([p[k] for p in self.pending]) for k in self.pending[0]}
        self.pending, self.count = [], 0
        priorities = self.adder.priorities(batch, policy) + self.priority_epsilon
        acting = self.adder.acting_fields
        packed = pack({k: v for k, v in batch.items() if k not in acting}, self.columns)
        for value in packed.values():
            if isinstance(value, Packed):
                metrics.frame_raw_bytes.inc(len(value) * value.item_nbytes)
                metrics.frame_compressed_bytes.inc(int(value.sizes.sum()))
        self.buffer.put(packed, priorities)


class InsertBuffer:
    """Bounded FIFO of item batches, drained into replay by a thread that never gives up.

    While replay is reachable, `put` applies backpressure: it waits until at most
    `in_flight` batches are queued, so a replay rate limiter slows the actor down instead of
    the actor racing ahead. While replay is unreachable, `put` never waits: the buffer
    grows to `limit` transitions, then drops the oldest and counts them.
    """

    def __init__(
        self,
        replay: Replay,
        limit: int,
        metrics,
        stop: threading.Event,
        in_flight: int = 2,
    ):
        self.replay, self.limit, self.metrics, self.stop = replay, limit, metrics, stop
        self.in_flight = in_flight
        self._batches: collections.deque = collections.deque()
        self._count = 0
        self._cond = threading.Condition()
        self._closing = False
        self._outage = False
        self._backlog = False  # batches were held for an outage and not all landed yet
        self._thread = threading.Thread(target=self._drain, name="insert", daemon=True)
        self._thread.start()

    def put(self, columns: dict[str, np.ndarray], priorities: np.ndarray) -> None:
        with self._cond:
            while not self._cond.wait_for(
                lambda: self._outage or len(self._batches) < self.in_flight, timeout=0.05
            ):  # the stop is set by this thread's own signal handler: it cannot notify
                if self.stop.is_set():
                    break
            if self._outage:
                self._hold(columns, priorities)
            else:
                self._batches.append((columns, priorities))
            self._count += len(priorities)
            while self._count > self.limit and len(self._batches) > 1:
                _, dropped = self._batches.popleft()
                self._count -= len(dropped)
                self.metrics.dropped.inc(len(dropped))
            self.metrics.buffered.set(self._count)
            self._cond.notify_all()

    def _hold(self, columns: dict[str, np.ndarray], priorities: np.ndarray) -> None:
        """Holds a batch while replay is away, merged with the newest held one up to
        HELD_CHUNK_BYTES, in memory of its own (memory.off_heap): thousands of small batches
        in malloc's heap and Python's object pools, between what the actor allocates
        meanwhile, would stay in its RSS after they have landed
        (docs/experiments/soak.md#what-changed-for-the-actors)."""
        newest = self._batches[-1] if len(self._batches) > 1 else None  # [0] may be in flight
        # Chunks of at most a 16th of the limit: dropping the oldest, should it be the one on
        # its way (it may land), costs no more than that.
        items = len(priorities) + (len(newest[1]) if newest else 0)
        if (
            newest
            and items <= self.limit // 16
            and codec.nbytes(newest[0]) + codec.nbytes(columns) <= HELD_CHUNK_BYTES
        ):
            self._batches.pop()
            columns = codec.concat([newest[0], columns])
            priorities = np.concatenate([newest[1], priorities])
        self._batches.append(off_heap(columns, priorities))

    def _drain(self) -> None:
        backoff = Backoff()
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._batches or self._closing)
                if not self._batches:
                    return
                columns, priorities = self._batches[0]
            try:
                self.replay.insert(columns, priorities)
            except Exception as err:  # replay away or refusing: keep the batch, retry later
                if self._closing:
                    return
                delay = backoff.next_delay()
                log.warning("insert failed (%s); retrying in %.2f s", short_error(err), delay)
                with self._cond:
                    self._outage = self._backlog = True
                    self._cond.notify_all()
                    self._cond.wait(delay)
                continue
            backoff.reset()
            with self._cond:
                self._outage = False
                if self._batches and self._batches[0][1] is priorities:
                    self._batches.popleft()
                    self._count -= len(priorities)
                self.metrics.buffered.set(self._count)
                drained = self._backlog and not self._batches
                self._backlog &= not drained
                self._cond.notify_all()
            self.metrics.inserted.inc(len(priorities))
            if drained:  # the backlog's memory goes back to the OS, not to the RSS high-water
                release_free_memory()

    def close(self, flush_seconds: float) -> None:
        """Gives the buffer up to flush_seconds to drain, then stops the thread; with the
        replay away it does not wait (nothing would land: a stop would only take longer)."""
        deadline = time.monotonic() + flush_seconds
        with self._cond:
            self._cond.wait_for(
                lambda: not self._batches or self._outage, max(0.0, deadline - time.monotonic())
            )
            self._closing = True
            self._cond.notify_all()
        self.replay.close()
        self._thread.join(5)
