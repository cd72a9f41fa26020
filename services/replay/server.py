"""The replay gRPC service: tables behind the apexrl.v1.Replay contract.

Every table operation runs on the asyncio event loop, one at a time, so tables need no
locks. UpdatePriorities answers once its keys are checked and counted and writes the sum
tree right after (Table.stage_priorities / apply_priorities), beside the caller's next
call; anything that reads the table applies the staged updates first. Callers the rate
limiter holds back wait on one condition that every insert and sample notifies, bounded by
their deadline. A checkpoint copies the arrays on the loop
(the only pause) and writes the file in a worker thread.
"""

import asyncio
import contextlib
import errno
import logging
import time
from functools import partial

import grpc
import numpy as np
import prometheus_client

from apexrl.common import tensors
from apexrl.common.errors import (
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
)
from apexrl.common.memory import trim_heaps
from apexrl.common.serving import Service
from apexrl.config import ReplayConfig, ReplayTableConfig
from apexrl.replay import checkpoint, keys
from apexrl.replay.metrics import ReplayMetrics
from apexrl.replay.rate_limiters import QueueLimiter, RateLimiter
from apexrl.replay.signature import parse_signature
from apexrl.replay.snapshot import Snapshot
from apexrl.replay.table import Table
from apexrl.v1 import replay_pb2, replay_pb2_grpc

log = logging.getLogger(__name__)


class ReplayServicer(replay_pb2_grpc.ReplayServicer):
    def __init__(
        self,
        tables: dict[str, Table],
        metrics: ReplayMetrics,
        checkpoint_dir: str = "",
        shard: int = 0,
    ):
        self.tables = tables
        self.shard = shard
        self.metrics = metrics
        self.checkpoint_dir = checkpoint_dir
        self._changed = asyncio.Condition()
        self._checkpoint_lock = asyncio.Lock()
        self._stopping = False
        self._idle_streams: set[asyncio.Task] = set()  # waiting for their next request
        self._sample_streams: set[asyncio.Task] = set()  # serving SampleStream

    # --- helpers ---------------------------------------------------------------------------

    def _table(self, name: str) -> Table:
        table = self.tables.get(name)
        if table is None:
            raise NotFound("table", f"no table {name!r} (tables: {sorted(self.tables)})")
        return table

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def _wait(
        self, context, table: Table, operation: str, ready, max_wait: float = 0.0
    ) -> None:
        """Waits until the rate limiter admits the call, bounded by the call's deadline (and by
        max_wait seconds when > 0: a request on a long-lived stream)."""
        if ready():
            return
        started = time.perf_counter()
        remaining = context.time_remaining()
        if max_wait > 0:
            remaining = max_wait if remaining is None else min(remaining, max_wait)
        try:
            # asyncio.timeout, not wait_for: wait_for runs the wait as a task of its own, and
            # between its end and this call's next step another call could take what ready()
            # saw (two samplers woken by one insert: the second met an empty queue).
            async with asyncio.timeout(remaining), self._changed:
                await self._changed.wait_for(lambda: self._stopping or ready())
        except TimeoutError:
            await context.abort(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"rate limiter held this {operation} on table {table.name!r} until the deadline",
            )
        finally:
            self.metrics.wait_seconds.labels(table.name, operation).observe(
                time.perf_counter() - started
            )
        if self._stopping:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "replay server is shutting down")

    async def stop_waiters(self) -> None:
        """Releases every call the rate limiter holds, and every stream waiting for its next
        request (they end UNAVAILABLE): what a stream sent before was answered, and a client
        that keeps its stream open must not hold the server's stop for its whole grace."""
        self._stopping = True
        for task in list(self._idle_streams) + list(self._sample_streams):
            task.cancel()
        await self._notify()

    async def _requests(self, request_iterator, context):
        """A client stream's requests until the client ends it, or until shutdown: a stream
        then ends UNAVAILABLE between two requests, never while one is being applied."""
        task = asyncio.current_task()
        requests = aiter(request_iterator)
        while True:
            if self._stopping:
                await context.abort(grpc.StatusCode.UNAVAILABLE, "replay server is shutting down")
            self._idle_streams.add(task)
            try:
                request = await anext(requests)
            except StopAsyncIteration:
                return
            except asyncio.CancelledError:
                if not self._stopping:
                    raise
                task.uncancel()  # stop_waiters' cancel: this stream ends UNAVAILABLE instead
                continue
            finally:
                self._idle_streams.discard(task)
            yield request

    # --- rpcs ------------------------------------------------------------------------------

    async def Insert(self, request_iterator, context):
        async for request in self._requests(request_iterator, context):
            table = self._table(request.table)
            columns = tensors.batch_from_proto(request.batch)
            priorities = (
                tensors.from_proto(request.priorities, "priorities")
                if request.HasField("priorities")
                else None
            )
            n = table.validate_insert(columns, priorities)
            max_wait = request.max_wait_seconds
            if not max_wait >= 0:  # NaN fails too
                raise InvalidArgument("max_wait_seconds", f"must be >= 0, got {max_wait}")
            await self._wait(context, table, "insert", partial(table.can_insert, n), max_wait)
            first_key = table.insert(columns, priorities)
            await self._notify()
            first_key |= self.shard << keys.SHARD_SHIFT
            yield replay_pb2.InsertResponse(inserted=n, first_key=first_key, table_size=table.size)

    async def _sample(
        self, request: replay_pb2.SampleRequest, context
    ) -> replay_pb2.SampleResponse:
        table = self._table(request.table)
        table.validate_sample(request.batch_size, request.beta)
        await self._wait(context, table, "sample", partial(table.can_sample, request.batch_size))
        result = table.sample(request.batch_size, request.beta)
        await self._notify()
        self.metrics.observe_sample(table, result.keys)
        response = replay_pb2.SampleResponse(
            table_size=result.table_size, total_priority=table.total_priority
        )
        tensors.batch_to_proto(result.columns, response.batch)
        tensors.to_proto(keys.with_shard(result.keys, self.shard), response.keys)
        tensors.to_proto(result.probabilities, response.probabilities)
        tensors.to_proto(result.weights, response.weights)
        return response

    async def Sample(self, request, context):
        return await self._sample(request, context)

    async def SampleStream(self, request, context):
        """Batches until max_batches or shutdown, which cancels the stream even while a batch
        waits for the client to read (a full prefetch queue holds it by flow control)."""
        task = asyncio.current_task()
        self._sample_streams.add(task)
        try:
            sent = 0
            while (request.max_batches == 0 or sent < request.max_batches) and not self._stopping:
                yield await self._sample(request.sample, context)
                sent += 1
        finally:
            self._sample_streams.discard(task)

    async def UpdatePriorities(self, request, context):
        return self._update_priorities(request)

    async def UpdatePrioritiesStream(self, request_iterator, context):
        async for request in self._requests(request_iterator, context):
            yield self._update_priorities(request)

    def _update_priorities(self, request) -> replay_pb2.UpdatePrioritiesResponse:
        table = self._table(request.table)
        wire_keys = tensors.array_from_proto(request.keys, "keys")
        priorities = tensors.array_from_proto(request.priorities, "priorities")
        updated, stale = table.stage_priorities(self._sequences(wire_keys), priorities)
        # The tree work runs once this answer is on its way, beside the caller's next call;
        # whatever reads the table before then applies the staged updates first.
        asyncio.get_running_loop().call_soon(table.apply_priorities)
        return replay_pb2.UpdatePrioritiesResponse(updated=updated, stale=stale)

    def _sequences(self, wire_keys: np.ndarray) -> np.ndarray:
        """The table's keys: the shard bits checked (another shard's key is refused) and
        removed. Negative keys pass through for the table to refuse."""
        if wire_keys.dtype not in (np.int64, np.uint64):
            return wire_keys  # the table names the wrong dtype
        owners = wire_keys >> keys.SHARD_SHIFT  # negative and huge keys: the table's to judge
        if (owners == self.shard).all():  # the usual case, in 3 numpy calls instead of 8
            return wire_keys & keys.SEQUENCE_MASK if self.shard else wire_keys
        plausible = (wire_keys >= 0) & (owners <= keys.MAX_SHARD)
        foreign = np.flatnonzero(plausible & (owners != self.shard))
        if len(foreign):
            i = int(foreign[0])
            raise InvalidArgument(
                "keys",
                f"keys[{i}] = {int(wire_keys[i])} belongs to shard {int(owners[i])}; "
                f"this replay is shard {self.shard}",
            )
        if self.shard == 0:
            return wire_keys
        return np.where(plausible, wire_keys & keys.SEQUENCE_MASK, wire_keys)

    async def Info(self, request, context):
        for table in self.tables.values():
            table.apply_priorities()  # Info's totals include every acknowledged update
        tables = [table_info(t, request.include_digest) for t in self.tables.values()]
        return replay_pb2.InfoResponse(tables=tables, shard=self.shard)

    async def Checkpoint(self, request, context):
        if not self.checkpoint_dir:
            raise FailedPrecondition("checkpoint_dir", "the server was started without one")
        try:
            return await self.checkpoint()
        except OSError as err:
            full = err.errno in (errno.ENOSPC, errno.EDQUOT)
            error = ResourceExhausted if full else Internal
            raise error(
                "checkpoint_dir", f"write failed, previous checkpoints kept: {err}"
            ) from err

    async def checkpoint(self) -> replay_pb2.CheckpointResponse:
        """Copies every table on the loop, a chunk of slots at a time with other calls served in
        between (copy-on-write: the copy is each table as of the start), then writes the file in
        a worker thread."""
        async with self._checkpoint_lock:
            started = time.perf_counter()
            snapshots = [t.begin_snapshot() for t in self.tables.values()]
            # The longest the loop spent copying at one go. A comprehension: a loop variable
            # would hold the last table's copies past the heap trim after the write.
            paused = max([await copy_yielding(s) for s in snapshots], default=0.0)

            def write() -> tuple:  # in a worker thread: joining the chunks is a copy too
                states = [snapshot.assemble() for snapshot in snapshots]
                snapshots.clear()  # the chunks, freed as soon as they are joined
                try:
                    return checkpoint.write_checkpoint(self.checkpoint_dir, states)
                finally:
                    # The copies (a table's size, twice) are freed into the heaps of two
                    # threads' arenas, which keep them: without the trim a replay's RSS
                    # wandered between 69 and 81 MB with checkpoints every 5 s.
                    del states
                    trim_heaps()

            try:
                path, size = await asyncio.to_thread(write)
            except OSError as err:  # nothing replaced: the previous checkpoints stay
                self.metrics.checkpoint_failures.inc()
                log.error("checkpoint failed, previous ones kept: %s", err)
                raise
            seconds = time.perf_counter() - started
            self.metrics.checkpoint_seconds.set(seconds)
            self.metrics.checkpoint_bytes.set(size)
            self.metrics.last_checkpoint = time.time()
            self.metrics.checkpoint_time.set(self.metrics.last_checkpoint)
            log.info(
                "checkpoint %s: %d bytes in %.2f s (tables paused at most %.3f s at a time)",
                path,
                size,
                seconds,
                paused,
            )
            return replay_pb2.CheckpointResponse(path=str(path), size_bytes=size, seconds=seconds)


async def copy_yielding(snapshot: Snapshot) -> float:
    """Copies a snapshot's chunks, serving other calls between them; the longest one took (s)."""
    longest = 0.0
    while not snapshot.done:
        step = time.perf_counter()
        snapshot.copy_next()
        longest = max(longest, time.perf_counter() - step)
        await asyncio.sleep(0)
    return longest


def table_info(table: Table, include_digest: bool = False) -> replay_pb2.TableInfo:
    limiter = table.rate_limiter
    return replay_pb2.TableInfo(
        name=table.name,
        capacity=table.capacity,
        size=table.size,
        signature=[
            replay_pb2.ColumnSpec(
                name=c.name,
                dtype=tensors.dtype_to_proto(c.dtype),
                shape=c.shape,
                codec=tensors.codec_to_proto(c.codec),
            )
            for c in table.signature or []
        ],
        alpha=table.alpha,
        min_size_to_sample=getattr(limiter, "min_size_to_sample", 0),
        samples_per_insert=getattr(limiter, "samples_per_insert", 0.0),
        error_buffer=getattr(limiter, "error_buffer", 0.0),
        inserts=table.inserts,
        samples=table.samples,
        priority_updates=table.priority_updates,
        stale_priority_updates=table.stale_priority_updates,
        total_priority=table.total_priority,
        max_priority=table.max_priority,
        digest=table.digest() if include_digest else "",
        stored_bytes=table.stored_bytes,
        sampler=table.sampler,
        remover=table.remover,
        max_times_sampled=table.max_times_sampled,
        rate_limiter=limiter.kind,
        removed=table.removed,
    )


def make_table(settings: ReplayTableConfig, max_batch_size: int, seed: int | None) -> Table:
    """One configured table; ValueError naming the table and the setting if it cannot work."""
    limiter: RateLimiter | QueueLimiter
    try:
        if settings.rate_limiter == "queue":
            limiter = QueueLimiter()
        else:
            limiter = RateLimiter(
                min_size_to_sample=settings.min_size_to_sample,
                samples_per_insert=settings.samples_per_insert,
                error_buffer=settings.error_buffer,
            )
        return Table(
            settings.name,
            settings.capacity,
            sampler=settings.sampler,
            remover=settings.remover,
            max_times_sampled=settings.max_times_sampled,
            alpha=settings.alpha,
            rate_limiter=limiter,
            signature=parse_signature(settings.signature),
            max_batch_size=max_batch_size,
            seed=seed,
        )
    except ValueError as err:
        if str(err).startswith("table "):  # already names it
            raise
        raise ValueError(f"table {settings.name!r}: {err}") from None


def build(
    config: ReplayConfig, registry: prometheus_client.CollectorRegistry
) -> tuple[Service, ReplayServicer]:
    """The replay service as a library: tables from config, restored from the newest checkpoint."""
    tables = {}
    for i, settings in enumerate(config.table_configs()):
        tables[settings.name] = make_table(
            settings, config.max_batch_size, seed=config.seed + i if config.seed else None
        )
    if config.checkpoint_dir:
        restored = checkpoint.load_newest(config.checkpoint_dir)
        if restored is None:
            log.info("no checkpoint in %s: starting empty", config.checkpoint_dir)
        else:
            path, states = restored
            for state in states:
                if state.name not in tables:
                    raise ValueError(
                        f"checkpoint {path} holds table {state.name!r}, not configured"
                    )
                tables[state.name].restore(state)
                log.info(
                    "restored table %r from %s: %d items, %d inserts, %d samples",
                    state.name,
                    path,
                    tables[state.name].size,
                    tables[state.name].inserts,
                    tables[state.name].samples,
                )
    metrics = ReplayMetrics(registry, tables)
    shard = keys.parse_shard(config.shard)
    metrics.shard.set(shard)
    servicer = ReplayServicer(tables, metrics, config.checkpoint_dir, shard)

    def register(server: grpc.aio.Server) -> list[str]:
        replay_pb2_grpc.add_ReplayServicer_to_server(servicer, server)
        return [replay_pb2.DESCRIPTOR.services_by_name["Replay"].full_name]

    async def periodic_checkpoints() -> None:
        while True:
            await asyncio.sleep(config.checkpoint_interval)
            with contextlib.suppress(OSError):  # logged and counted; the next one may work
                await servicer.checkpoint()

    async def on_stop() -> None:
        if config.checkpoint_dir:
            with contextlib.suppress(OSError):  # logged and counted
                await servicer.checkpoint()

    background = (
        [periodic_checkpoints] if config.checkpoint_dir and config.checkpoint_interval > 0 else []
    )
    return Service(
        register=register, on_shutdown=servicer.stop_waiters, on_stop=on_stop, background=background
    ), servicer
