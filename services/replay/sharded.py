"""ShardedReplayClient: several replay shards behind ReplayClient's verbs.

Each shard is a plain `apexrl replay` with its own shard id (the top bits of its keys), tables,
rate limiter and checkpoints. The client does the global maths:

- Sampling is proportional to the global priorities. A batch of B is split over the live
  shards by a multinomial draw, shard s weighted by its sum of p^alpha (T_s); the shard
  requests go out in parallel; each response carries T_s at sampling time, so item i of shard s
  has global probability P(i) = P_s(i) T_s / T, T = sum of every live shard's T_s, and
  importance weight (N P(i))^-beta normalized by the batch's largest, N = the items of every
  live shard. Each item's marginal probability and weight are those of one table holding every
  item; stratification is per shard. T_s and sizes of shards not in a batch come from their
  last response or Info, refreshed when older than Shards.VIEW_SECONDS. A shard with T_s = 0
  (empty) gets no share; when every shard is empty the batch goes to one shard, whose rate
  limiter holds it until the table can be sampled, as one table's would.
- Inserts go round robin over the live shards, one batch per shard. The rate limiter is each
  shard's own (min_size_to_sample, samples_per_insert, error_buffer per shard): with several
  live shards, an insert a shard holds longer than HOP_SECONDS moves on to the next (a request
  the limiter held is not inserted, replay.proto), so inserts flow to the shards sampling
  drains and neither side can wait on the other; samples are never moved (that would bias
  them). Over the whole, samples <= samples_per_insert x inserts + the sum of the shards'
  windows.
- Priority updates go to the shard each key names, in parallel. A key naming a shard the
  client has never seen is an error (nothing is sent); keys of a shard that is down are
  dropped and counted (`dropped_priority_updates`), as stale keys are.
- A shard that answers UNAVAILABLE is down: sampling and inserts go on with the others (the
  weights renormalized over them) until it rejoins.

Which shards there are (the addresses), which of them answer and their views are Shards'
(shards.py); this client marks the shards its calls find down.
"""

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TypeVar

import grpc
import numpy as np

from apexrl.common import codec
from apexrl.common.backoff import Backoff, server_gone
from apexrl.replay import keys as keyspace
from apexrl.replay.client import Replay, ReplayClient, SampledBatch
from apexrl.replay.shards import DNS_PREFIX, Shard, ShardError, Shards
from apexrl.v1 import replay_pb2

T = TypeVar("T")


def connect(address: str, **options) -> Replay:
    """The client the `replay` setting asks for: one replay, or shards (see the module doc)."""
    if "," in address or address.startswith(DNS_PREFIX):
        return ShardedReplayClient(address, **options)
    return ReplayClient(address, **options)


class ShardedReplayClient:
    HOP_SECONDS = 0.05

    def __init__(
        self,
        address: str,
        *,
        table: str = "default",
        timeout: float = 30.0,
        retry_seconds: float | None = 60.0,
        seed: int | None = None,
        stop: threading.Event | None = None,
        **options,
    ):
        """options: max_message_mb, tls, channel_options (see GrpcClient). retry_seconds: how
        long a call waits for some shard to answer (None: forever); not at all once `stop`
        (the process's) is set."""
        self.address, self.table, self.timeout = address, table, timeout
        self.retry_seconds, self.stop = retry_seconds, stop or threading.Event()
        self._shards = Shards(address, table=table, timeout=timeout, options=options)
        self._lock = threading.Lock()
        self._next_insert = 0
        self._rng = np.random.default_rng(seed)
        self.dropped_priority_updates = 0

    def _with_live(self, what: str, attempt: Callable[[list[Shard]], T | None]) -> T:
        """attempt(live shards) until it succeeds, while some shard may come back within
        retry_seconds (attempt marks the shards it finds down)."""
        started, backoff = time.monotonic(), Backoff()
        while True:
            live = self._shards.live()
            if live:
                result = attempt(live)
                if result is not None:
                    return result
                continue  # a shard went down: again with the others
            waited = time.monotonic() - started
            if self.retry_seconds is not None and waited >= self.retry_seconds:
                raise NoShard(f"replay {what}: no shard of {self.address} answers")
            if self.stop.wait(backoff.next_delay()):
                raise NoShard(f"replay {what}: no shard of {self.address} answers (stopping)")
            self._shards.discover(force=True)

    def insert(
        self, columns: Mapping[str, np.ndarray | codec.Packed], priorities: np.ndarray | None = None
    ) -> replay_pb2.InsertResponse:
        """Inserts one batch into the next live shard (see the module doc for the rate
        limiter); returns its response (first_key names the shard)."""

        def attempt(live: list[Shard]) -> replay_pb2.InsertResponse | None:
            with self._lock:
                start, self._next_insert = self._next_insert, self._next_insert + 1
            order = [live[(start + k) % len(live)] for k in range(len(live))]
            for k, shard in enumerate(order):
                last = k == len(order) - 1
                try:
                    return shard.client.insert(
                        columns, priorities, max_wait=None if last else self.HOP_SECONDS
                    )
                except grpc.RpcError as err:
                    if server_gone(err, self.stop.is_set()):
                        self._shards.down(shard, err)
                        return None
                    if err.code() != grpc.StatusCode.DEADLINE_EXCEEDED or last:
                        raise
            return None

        return self._with_live("insert", attempt)

    def sample(self, batch_size: int, beta: float = 0.4) -> SampledBatch:
        def attempt(live: list[Shard]) -> SampledBatch | None:
            totals = np.array([s.total for s in live])
            if totals.sum() > 0:
                counts = self._rng.multinomial(batch_size, totals / totals.sum())
            else:  # every shard empty: one shard's rate limiter holds the batch
                counts = np.zeros(len(live), np.int64)
                with self._lock:
                    counts[self._next_insert % len(live)] = batch_size
            asked = [(s, int(c)) for s, c in zip(live, counts, strict=True) if c > 0]
            results = self._shards.map(lambda sc: sc[0].client.sample_response(sc[1], beta), asked)
            down = False
            for (shard, _), result in zip(asked, results, strict=True):
                if isinstance(result, grpc.RpcError) and server_gone(result, self.stop.is_set()):
                    self._shards.down(shard, result)
                    down = True
                elif isinstance(result, BaseException):
                    raise result
                else:
                    shard.note(result.total_priority, result.table_size)
            if down:
                return None
            return self._merge([(s, r) for (s, _), r in zip(asked, results, strict=True)], beta)

        return self._with_live("sample", attempt)

    def _merge(self, parts: list, beta: float) -> SampledBatch:
        """One batch from the shards' responses, with global probabilities and weights."""
        batches = [SampledBatch.from_proto(response) for _, response in parts]
        live = [s for s in self._shards.known() if s.alive]
        total = sum(s.total for s in live)  # the sampled ones' views are this batch's
        size = sum(s.size for s in live)
        probabilities = np.concatenate(
            [
                b.probabilities * (response.total_priority / total)
                for b, (_, response) in zip(batches, parts, strict=True)
            ]
        )
        if beta == 0:
            weights = np.ones(len(probabilities), np.float32)
        else:
            raw = (size * probabilities) ** -beta
            weights = (raw / raw.max()).astype(np.float32)
        return SampledBatch(
            columns=codec.concat([b.columns for b in batches]),
            keys=np.concatenate([b.keys for b in batches]),
            probabilities=probabilities,
            weights=weights,
            table_size=size,
        )

    def sample_stream(
        self, batch_size: int, beta: float = 0.4, max_batches: int = 0
    ) -> Iterator[SampledBatch]:
        """Batches one after another (each split over the shards afresh); max_batches = 0:
        until the caller stops iterating. A Sample a shard's rate limiter holds past the
        deadline (a shard below min_size_to_sample) is asked again, as one replay's stream is
        reopened at its deadline: the learner waits for data instead of failing."""
        sent = 0
        while max_batches == 0 or sent < max_batches:
            try:
                batch = self.sample(batch_size, beta)
            except grpc.RpcError as err:
                if self.stop.is_set():
                    return
                if err.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                    raise
                continue
            yield batch
            sent += 1

    def update_priorities(
        self, keys: np.ndarray, priorities: np.ndarray
    ) -> replay_pb2.UpdatePrioritiesResponse:
        """Sends each shard its keys' priorities, in parallel; keys of a shard that is down
        are dropped and counted. `stale` in the answer includes them."""
        keys = np.asarray(keys, np.int64)
        priorities = np.asarray(priorities)
        if keys.shape != priorities.shape or keys.ndim != 1:
            raise ValueError(
                f"keys and priorities: shapes {list(keys.shape)} and "
                f"{list(priorities.shape)} differ or are not 1-D"
            )
        owners = keyspace.shard_of(keys)
        self._shards.live()
        shards = {s.id: s for s in self._shards.known()}
        unknown = np.flatnonzero(~np.isin(owners, list(shards)))
        if len(unknown):
            i = int(unknown[0])
            raise ShardError(
                f"keys[{i}] = {int(keys[i])} names shard {int(owners[i])}, which is none of "
                f"the shards {sorted(shards)} of {self.address}"
            )
        parts = [(shards[int(s)], owners == s) for s in np.unique(owners)]
        live = [(shard, mask) for shard, mask in parts if shard.alive]
        dropped = sum(int(mask.sum()) for shard, mask in parts if not shard.alive)
        results = self._shards.map(
            lambda sm: sm[0].client.update_priorities(keys[sm[1]], priorities[sm[1]]), live
        )
        updated = stale = 0
        for (shard, mask), result in zip(live, results, strict=True):
            if isinstance(result, grpc.RpcError) and (
                server_gone(result, self.stop.is_set())
                or result.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            ):
                self._shards.down(shard, result)
                dropped += int(mask.sum())
            elif isinstance(result, BaseException):
                raise result
            else:
                updated, stale = updated + result.updated, stale + result.stale
        with self._lock:
            self.dropped_priority_updates += dropped
        return replay_pb2.UpdatePrioritiesResponse(updated=updated, stale=stale + dropped)

    def shard_infos(self) -> dict[int, replay_pb2.TableInfo]:
        """Each live shard's table, by shard id."""
        live = self._shards.live()
        infos = self._shards.map(lambda s: self._shards.table_info(s.client), live)
        return {s.id: i[1] for s, i in zip(live, infos, strict=True) if isinstance(i, tuple)}

    def info(self) -> replay_pb2.TableInfo:
        """The live shards' tables as one: sizes, counters and masses summed."""
        infos = list(self.shard_infos().values())
        if not infos:
            raise NoShard(f"replay info: no shard of {self.address} answers")
        merged = replay_pb2.TableInfo()
        merged.CopyFrom(infos[0])
        for field in (
            "capacity",
            "size",
            "inserts",
            "samples",
            "priority_updates",
            "stale_priority_updates",
            "total_priority",
            "stored_bytes",
            "min_size_to_sample",
            "error_buffer",
        ):
            setattr(merged, field, sum(getattr(i, field) for i in infos))
        merged.max_priority = max(i.max_priority for i in infos)
        return merged

    def checkpoint(self) -> list[replay_pb2.CheckpointResponse]:
        """A checkpoint on every live shard (each its own file)."""
        return [s.client.checkpoint() for s in self._shards.live()]

    def close(self) -> None:
        self._shards.close()

    def __enter__(self) -> "ShardedReplayClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class NoShard(grpc.RpcError):
    """No shard answered within retry_seconds (reads as UNAVAILABLE)."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return str(self)
