"""ReplayClient: the learner's and actors' view of a replay server.

Every call carries a deadline and is retried with backoff while the server is away
(UNAVAILABLE, or CANCELLED by the server's own stop: restarting, partitioned), for up to
`retry_seconds` (None: forever, as actors want); never once the caller stops.
Inserts may be re-sent after a reconnect, so delivery is at-least-once.

Inserts and priority updates each go over one long-lived stream (Insert,
UpdatePrioritiesStream; opening a stream per call cost ~1.6 ms, more than a batch of 64
CartPole transitions takes to send, and a unary call costs the replay its per-call setup):
threads share it, each waiting for its own answer. Each insert carries the client's timeout
as its `max_wait_seconds`, so the replay itself ends a request the rate limiter holds too
long, with DEADLINE_EXCEEDED, as a per-call deadline did. A stream that fails in any way is
dropped and the next call opens a new one; requests it never read go again.
"""

import collections
import queue
import threading
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Protocol

import grpc
import numpy as np

from apexrl.common import tensors
from apexrl.common.backoff import Backoff, server_gone
from apexrl.common.client import GrpcClient
from apexrl.common.codec import Packed
from apexrl.v1 import replay_pb2, replay_pb2_grpc

# Deadline of a long-lived stream (inserts, prefetching samples); clients reopen well before it.
STREAM_SECONDS = 3600.0


@dataclass
class SampledBatch:
    columns: dict[str, np.ndarray | Packed]  # a compressed column's items as they were inserted
    keys: np.ndarray  # int64 [B]
    probabilities: np.ndarray  # float64 [B]
    weights: np.ndarray  # float32 [B]
    table_size: int

    @classmethod
    def from_proto(cls, response: replay_pb2.SampleResponse) -> "SampledBatch":
        return cls(
            columns=tensors.batch_from_proto(response.batch),
            keys=tensors.array_from_proto(response.keys, "keys"),
            probabilities=tensors.array_from_proto(response.probabilities, "probabilities"),
            weights=tensors.array_from_proto(response.weights, "weights"),
            table_size=response.table_size,
        )


def insert_request(
    table: str,
    columns: Mapping[str, np.ndarray | Packed],
    priorities: np.ndarray | None,
    max_wait_seconds: float = 0.0,
) -> replay_pb2.InsertRequest:
    request = replay_pb2.InsertRequest(table=table, max_wait_seconds=max_wait_seconds)
    tensors.batch_to_proto(columns, request.batch)
    if priorities is not None:
        tensors.to_proto(priorities, request.priorities)
    return request


class StreamTimeout(grpc.RpcError):
    """No ack within the bound: the connection is presumed dead (reads as DEADLINE_EXCEEDED)."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.DEADLINE_EXCEEDED

    def details(self) -> str:
        return str(self)


class StreamEnded(grpc.RpcError):
    """The stream ended before the replay read this request: nothing of it was applied, and
    it can go again on a new stream (reads as UNAVAILABLE, so it is retried)."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return f"stream ended: {self}"


class AckedStream:
    """One long-lived call that answers each request with one response, in order (Insert,
    UpdatePrioritiesStream). Any thread may send: `send` returns a future of that request's
    own response, so several can be in flight; a thread reads the responses.

    When the call ends, the oldest unanswered request gets its error (the request the
    replay refused, or the lost connection); the ones sent after it were never read and get
    StreamEnded (UNAVAILABLE: send them again on a new stream)."""

    def __init__(self, method: grpc.StreamStreamMultiCallable):
        self.opened = time.monotonic()
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        self._pending: collections.deque[Future] = collections.deque()  # sent, unanswered
        self._lock = threading.Lock()
        self._ended = False
        self._call = method(iter(self._requests.get, None), timeout=STREAM_SECONDS)
        self._reader = threading.Thread(target=self._read, name="stream-acks", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        error: BaseException = EOFError("the replay ended the stream")
        try:
            for response in self._call:
                with self._lock:
                    future = self._pending.popleft()
                future.set_result(response)
        except grpc.RpcError as err:
            error = err
        with self._lock:
            self._ended = True
            pending, self._pending = self._pending, collections.deque()
        for i, future in enumerate(pending):
            future.set_exception(error if i == 0 else StreamEnded("an earlier request ended it"))

    def send(self, request) -> Future:
        """Queues a request; the future holds its response, or its error (StreamEnded if
        the stream had ended already)."""
        future: Future = Future()
        with self._lock:
            if not self._ended:
                self._pending.append(future)
                self._requests.put(request)
                return future
        future.set_exception(StreamEnded("it ended before this request was sent"))
        return future

    @staticmethod
    def ack(future: Future, timeout: float):
        """The response (the replay bounds the rate limiter's wait by each request's
        max_wait_seconds; `timeout` only guards against a silent peer), or the error."""
        try:
            return future.result(timeout)
        except TimeoutError:
            raise StreamTimeout(f"no response on the stream in {timeout:.1f} s") from None

    def close(self) -> None:
        """Half-closes (the replay answers what it has, then ends the call); cancels if it
        does not end promptly."""
        self._requests.put(None)
        self._reader.join(5)
        if self._reader.is_alive():
            self._call.cancel()
            self._reader.join(5)


class ReplayWriter:
    """Transitions one at a time, sent in batches over an insert stream of its own with up to
    `window` batches awaiting their acks (Reverb's writers: append, and confirm on flush).

    `append` copies the item into a preallocated batch; a full batch is sent without waiting;
    `flush` sends what is buffered and waits for every ack. `landed` counts the items the
    replay acknowledged. Delivery is at-least-once: when the stream fails (UNAVAILABLE:
    retried as the client retries) the batches without an ack are sent again on a new one.
    A refused batch (INVALID_ARGUMENT, ...) raises from the call that learns of it; the
    batches after it are sent again with the next batch or flush.
    """

    def __init__(self, client: "ReplayClient", batch: int = 64, window: int = 8):
        if batch < 1 or window < 1:
            raise ValueError(f"batch and window must be >= 1, got {batch}, {window}")
        self.client, self.batch, self.window = client, batch, window
        self.landed = 0
        self._columns: dict[str, np.ndarray] | None = None  # from the first item's arrays
        self._priorities = np.zeros(batch, np.float64)
        self._count = 0
        self._unacked: collections.deque = collections.deque()  # (request, future): no ack yet
        self._stream: AckedStream | None = None

    def append(self, item: dict[str, np.ndarray], priority: float) -> None:
        if self._count == self.batch:  # still full: sending it failed last time
            self._send_buffered()
        if self._columns is None:
            self._columns = {
                k: np.zeros((self.batch, *np.shape(v)), np.asarray(v).dtype)
                for k, v in item.items()
            }
        for name, column in self._columns.items():
            column[self._count] = item[name]
        self._priorities[self._count] = priority
        self._count += 1
        if self._count == self.batch:
            self._send_buffered()

    def flush(self) -> None:
        """Sends what is buffered; returns once the replay has acknowledged everything."""
        if self._count:
            self._send_buffered()
        while self._unacked:
            self._take_ack()

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    def _send_buffered(self) -> None:
        while len(self._unacked) >= self.window:  # may raise: the batch then stays buffered
            self._take_ack()
        n, self._count = self._count, 0
        assert self._columns is not None  # allocated by the first append
        columns = {k: v[:n] for k, v in self._columns.items()}  # to_proto copies the bytes
        request = insert_request(
            self.client.table, columns, self._priorities[:n], self.client.timeout
        )
        stream = self._open()  # (a new stream re-sends the unacknowledged before this one)
        self._unacked.append((request, stream.send(request)))

    def _open(self) -> AckedStream:
        if self._stream is None:  # a new stream: what the old one left unacknowledged first
            self._stream = AckedStream(self.client.stub.Insert)
            self._unacked = collections.deque(
                (request, self._stream.send(request)) for request, _ in self._unacked
            )
        return self._stream

    def _take_ack(self) -> None:
        def ack() -> replay_pb2.InsertResponse:
            try:
                self._open()
                future = self._unacked[0][1]
                return AckedStream.ack(future, self.client.timeout + ReplayClient.ACK_MARGIN)
            except BaseException:
                self.close()  # its remaining acks are lost with it
                raise

        try:
            response = self.client._retry(ack, "insert")
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.UNAVAILABLE:
                self._unacked.popleft()  # refused: the ones after it go again on a new stream
            raise
        self._unacked.popleft()
        self.landed += response.inserted


class Replay(Protocol):
    """What the services use of a replay: one (ReplayClient) or shards (ShardedReplayClient),
    as `sharded.connect` picks from the `replay` setting."""

    table: str

    def insert(
        self, columns: Mapping[str, np.ndarray | Packed], priorities: np.ndarray | None = None
    ) -> replay_pb2.InsertResponse: ...

    def sample(self, batch_size: int, beta: float = 0.4) -> SampledBatch: ...

    def sample_stream(
        self, batch_size: int, beta: float = 0.4, max_batches: int = 0
    ) -> Iterator[SampledBatch]: ...

    def update_priorities(
        self, keys: np.ndarray, priorities: np.ndarray
    ) -> replay_pb2.UpdatePrioritiesResponse: ...

    def info(self) -> replay_pb2.TableInfo: ...

    def close(self) -> None: ...


class ReplayClient(GrpcClient):
    # A rate-limited insert may wait up to `timeout` at the replay; beyond this margin more
    # without an ack, the stream is given up.
    ACK_MARGIN = 10.0

    def __init__(self, address: str, *, table: str = "default", timeout: float = 30.0, **options):
        """options: retry_seconds, max_message_mb, tls (see GrpcClient)."""
        super().__init__(address, timeout=timeout, **options)
        self.table = table
        self.stub = replay_pb2_grpc.ReplayStub(self.channel)
        self._streams: dict[str, AckedStream] = {}  # by rpc name
        self._streams_lock = threading.Lock()

    def insert(
        self,
        columns: Mapping[str, np.ndarray | Packed],
        priorities: np.ndarray | None = None,
        max_wait: float | None = None,
    ) -> replay_pb2.InsertResponse:
        """Inserts one columnar batch; returns once it is in the table.

        A batch the rate limiter holds waits up to max_wait seconds (None: the client's
        timeout), then fails with DEADLINE_EXCEEDED, not inserted.
        """
        wait = self.timeout if max_wait is None else min(max_wait, self.timeout)
        request = insert_request(self.table, columns, priorities, wait)
        return self._retry(lambda: self._over_stream("Insert", request), "insert")

    def _over_stream(self, rpc: str, request):
        """Sends one request over the client's long-lived `rpc` stream and waits for its
        response; other threads' requests may be in flight beside it."""
        with self._streams_lock:
            old = self._streams.get(rpc)
            if old is None or time.monotonic() - old.opened > STREAM_SECONDS / 2:
                self._streams[rpc] = AckedStream(getattr(self.stub, rpc))
            stream = self._streams[rpc]
        if old is not None and old is not stream:
            old.close()  # reopened well before the stream's own deadline
        try:
            return AckedStream.ack(stream.send(request), self.timeout + self.ACK_MARGIN)
        except BaseException:
            self._drop_stream(rpc, stream)  # ended, or presumed dead
            raise

    def writer(self, batch: int = 64, window: int = 8) -> ReplayWriter:
        """A writer of single transitions (see ReplayWriter); close it, or flush, when done."""
        return ReplayWriter(self, batch, window)

    def _drop_stream(self, rpc: str, stream: AckedStream) -> None:
        with self._streams_lock:
            if self._streams.get(rpc) is not stream:
                return  # another caller dropped it already
            del self._streams[rpc]
        stream.close()

    def close(self) -> None:
        super().close()  # first: a call waiting for its response fails at once, never holds close
        for stream in list(self._streams.values()):
            stream.close()
        self._streams.clear()

    def sample(self, batch_size: int, beta: float = 0.4) -> SampledBatch:
        return SampledBatch.from_proto(self.sample_response(batch_size, beta))

    def sample_response(self, batch_size: int, beta: float = 0.4) -> replay_pb2.SampleResponse:
        """One batch as the replay sent it (with its total_priority, for a sharded client)."""
        request = replay_pb2.SampleRequest(table=self.table, batch_size=batch_size, beta=beta)
        return self._retry(lambda: self.stub.Sample(request, timeout=self.timeout), "sample")

    def sample_stream(
        self, batch_size: int, beta: float = 0.4, max_batches: int = 0
    ) -> Iterator[SampledBatch]:
        """Batches streamed by the server (prefetching); reopens the stream after outages.

        With max_batches = 0 it runs until the caller stops iterating. A stream ends at its
        deadline (STREAM_SECONDS) and is reopened.
        """
        sample = replay_pb2.SampleRequest(table=self.table, batch_size=batch_size, beta=beta)
        received, backoff = 0, Backoff()
        while max_batches == 0 or received < max_batches:
            remaining = 0 if max_batches == 0 else max_batches - received
            request = replay_pb2.SampleStreamRequest(sample=sample, max_batches=remaining)
            call = self.stub.SampleStream(request, timeout=STREAM_SECONDS)
            try:
                for response in call:
                    backoff.reset()
                    received += 1
                    yield SampledBatch.from_proto(response)
            except grpc.RpcError as err:
                if self.stopping():  # this process cancelled it (its stop, or close)
                    return
                if server_gone(err):
                    if self.stop is None:
                        time.sleep(backoff.next_delay())
                    elif self.stop.wait(backoff.next_delay()):
                        return
                elif err.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                    raise
            finally:
                call.cancel()

    def update_priorities(
        self, keys: np.ndarray, priorities: np.ndarray
    ) -> replay_pb2.UpdatePrioritiesResponse:
        request = self.update_request(keys, priorities)
        return self._retry(
            lambda: self._over_stream("UpdatePrioritiesStream", request), "update_priorities"
        )

    def update_request(
        self, keys: np.ndarray, priorities: np.ndarray
    ) -> replay_pb2.UpdatePrioritiesRequest:
        request = replay_pb2.UpdatePrioritiesRequest(table=self.table)
        tensors.to_proto(np.asarray(keys, np.int64), request.keys)
        tensors.to_proto(priorities, request.priorities)
        return request

    def info(self) -> replay_pb2.TableInfo:
        response = self._retry(
            lambda: self.stub.Info(replay_pb2.InfoRequest(), timeout=self.timeout), "info"
        )
        for table in response.tables:
            if table.name == self.table:
                return table
        raise KeyError(f"replay {self.address} has no table {self.table!r}")

    def checkpoint(self) -> replay_pb2.CheckpointResponse:
        return self._retry(
            lambda: self.stub.Checkpoint(replay_pb2.CheckpointRequest(), timeout=self.timeout),
            "checkpoint",
        )
