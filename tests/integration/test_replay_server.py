"""The replay service over real gRPC (servers bound to port 0, no mocks)."""

import threading
import time
import urllib.request

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from apexrl.common import codec, tensors
from apexrl.replay.client import AckedStream, StreamEnded, insert_request
from apexrl.v1 import replay_pb2, tensor_pb2
from tests.conftest import transitions, wait_for


def metrics_text(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return response.read().decode()


def metrics_containing(port: int, *needles: str) -> str | None:
    text = metrics_text(port)
    return text if all(needle in text for needle in needles) else None


def health_status(address: str, service: str = "") -> int:
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status


def test_insert_then_sample_round_trip(replay):
    with replay.client() as client:
        ack = client.insert(transitions(100), np.linspace(0.1, 10, 100))
        assert (ack.inserted, ack.first_key, ack.table_size) == (100, 0, 100)
        ack = client.insert(transitions(20, start=100))
        assert (ack.first_key, ack.table_size) == (100, 120)
        batch = client.sample(64, beta=0.5)
    assert batch.table_size == 120
    assert set(batch.columns) == {"obs", "action", "reward", "discount", "next_obs"}
    # Each row must be the row inserted under that key (values encode the insert index).
    np.testing.assert_array_equal(batch.columns["obs"], transitions(120)["obs"][batch.keys])
    np.testing.assert_array_equal(batch.columns["action"], batch.keys % 2)
    assert batch.weights.dtype == np.float32 and batch.weights.max() == pytest.approx(1.0)
    assert np.all(batch.probabilities > 0)


def test_info_reports_signature_counters_and_digest(replay):
    with replay.client() as client:
        client.insert(transitions(10))
        client.sample(4)
        info = client.info()
        digest = (
            client.stub.Info(replay_pb2.InfoRequest(include_digest=True), timeout=5)
            .tables[0]
            .digest
        )
    assert (info.size, info.inserts, info.samples) == (10, 10, 4)
    assert info.capacity == 1_000_000 and info.alpha == pytest.approx(0.6)
    spec = {c.name: (c.dtype, tuple(c.shape)) for c in info.signature}
    assert spec["obs"] == (tensor_pb2.FLOAT32, (4,))
    assert spec["action"] == (tensor_pb2.INT64, ())
    assert digest == replay.table.digest() and len(digest) == 64


def test_update_priorities_ignores_stale_keys(replay_factory):
    server = replay_factory(capacity=8)
    with server.client() as client:
        client.insert(transitions(8))
        keys = client.sample(8).keys
        client.insert(transitions(3, start=8))  # overwrites slots of keys 0, 1, 2
        response = client.update_priorities(np.array([0, 1, 2, 5, 6]), np.full(5, 3.0))
        info = client.info()
    assert (response.updated, response.stale) == (2, 3)
    assert (info.priority_updates, info.stale_priority_updates) == (2, 3)
    assert set(keys) <= set(range(8))
    assert server.table.priorities[5 % 8] == 3.0


def test_sample_stream_sends_max_batches(replay):
    with replay.client() as client:
        client.insert(transitions(50))
        batches = list(client.sample_stream(16, beta=0.4, max_batches=5))
    assert len(batches) == 5 and all(len(b.keys) == 16 for b in batches)


def test_sample_waits_for_min_size_then_proceeds(replay_factory):
    server = replay_factory(min_size_to_sample=30)
    results = {}
    with server.client() as sampler, server.client() as writer:
        writer.insert(transitions(10))
        thread = threading.Thread(target=lambda: results.update(batch=sampler.sample(8)))
        thread.start()
        # The sampler is parked in the rate limiter until the table reaches 30 items.
        waits = server.servicer.metrics.wait_seconds.labels("default", "sample")
        thread.join(0.3)
        assert thread.is_alive() and "batch" not in results
        writer.insert(transitions(25, start=10))
        thread.join(20)
    assert not thread.is_alive()
    assert results["batch"].table_size == 35
    assert waits._sum.get() > 0  # the wait was measured


def test_rate_limited_sample_ends_at_its_deadline(replay_factory):
    server = replay_factory(min_size_to_sample=100)
    with server.client(timeout=0.5) as client:
        client.insert(transitions(10))
        with pytest.raises(grpc.RpcError) as caught:
            client.sample(8)
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


def test_samples_per_insert_ratio_blocks_inserts_until_sampled(replay_factory):
    # diff = inserts * 1 - samples must stay below 1 * 10 + 5 = 15 for inserts to proceed.
    server = replay_factory(min_size_to_sample=10, samples_per_insert=1.0, error_buffer=5.0)
    with server.client(timeout=0.5) as client:
        client.insert(transitions(16))  # admitted: diff was 0 before it
        with pytest.raises(grpc.RpcError) as caught:
            client.insert(transitions(1, start=16))
        assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        client.sample(8)  # diff 16 -> 8, inside the window again
        assert client.insert(transitions(1, start=16)).table_size == 17


def test_unknown_table_is_not_found(replay):
    with replay.client(table="nope") as client:
        with pytest.raises(grpc.RpcError) as caught:
            client.sample(4)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert "table" in caught.value.details() and "nope" in caught.value.details()


def _tensor(array) -> tensor_pb2.Tensor:
    return tensors.to_proto(np.asarray(array))


def _bad_insert(mutate) -> replay_pb2.InsertRequest:
    request = insert_request("default", transitions(4, start=1000), np.ones(4))
    mutate(request)
    return request


BAD_INSERTS = {
    "wrong dtype": (lambda r: tensors.to_proto(np.zeros((4, 4), np.float64), r.batch.columns["obs"]), 'columns["obs"]'),
    "wrong shape": (lambda r: tensors.to_proto(np.zeros((4, 5), np.float32), r.batch.columns["obs"]), 'columns["obs"]'),
    "ragged columns": (lambda r: tensors.to_proto(np.zeros(3, np.int64), r.batch.columns["action"]), "batch"),
    "missing column": (lambda r: r.batch.columns.pop("reward"), "reward"),
    "extra column": (lambda r: tensors.to_proto(np.zeros(4), r.batch.columns["extra"]), "extra"),
    "nan priority": (lambda r: tensors.to_proto(np.array([1, np.nan, 1, 1]), r.priorities), "priorities"),
    "inf priority": (lambda r: tensors.to_proto(np.array([1, np.inf, 1, 1]), r.priorities), "priorities"),
    "negative priority": (lambda r: tensors.to_proto(np.array([1, -1.0, 1, 1]), r.priorities), "priorities"),
    "priorities length": (lambda r: tensors.to_proto(np.ones(3), r.priorities), "priorities"),
    "integer priorities": (lambda r: tensors.to_proto(np.ones(4, np.int64), r.priorities), "priorities"),
    "truncated tensor": (lambda r: setattr(r.batch.columns["obs"], "data", b"\x00" * 7), 'columns["obs"].data'),
    "unset dtype": (lambda r: setattr(r.batch.columns["obs"], "dtype", 0), 'columns["obs"].dtype'),
    "unknown dtype": (lambda r: setattr(r.batch.columns["obs"], "dtype", 99), 'columns["obs"].dtype'),
    "negative dim": (lambda r: r.batch.columns["obs"].shape.__setitem__(0, -4), 'columns["obs"].shape'),
    "empty batch": (lambda r: r.CopyFrom(insert_request("default", transitions(0), None)), "batch"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(BAD_INSERTS))
def test_bad_insert_is_refused_and_changes_nothing(replay, case):
    mutate, field = BAD_INSERTS[case]
    with replay.client() as client:
        client.insert(transitions(10), np.ones(10))
        before = replay.table.digest()
        with pytest.raises(grpc.RpcError) as caught:
            list(client.stub.Insert(iter([_bad_insert(mutate)]), timeout=5))
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
        assert field in caught.value.details()
        assert replay.table.digest() == before
        assert client.insert(transitions(1, start=10)).table_size == 11  # still serving
    assert health_status(replay.address) == health_pb2.HealthCheckResponse.SERVING


def test_oversized_insert_batch_is_refused(replay_factory):
    server = replay_factory(capacity=100, max_batch_size=50)
    with server.client() as client:
        with pytest.raises(grpc.RpcError) as caught:
            client.insert(transitions(51))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "batch" in caught.value.details()
    assert server.table.size == 0


def test_message_above_the_size_limit_is_resource_exhausted(replay_factory):
    server = replay_factory(max_message_mb=1)
    with server.client(max_message_mb=8) as client:
        with pytest.raises(grpc.RpcError) as caught:
            client.insert({"obs": np.zeros((2, 1024 * 1024), np.uint8)})
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert server.table.size == 0


def _request(**fields) -> replay_pb2.SampleRequest:
    return replay_pb2.SampleRequest(**{"table": "default", "batch_size": 8, "beta": 0.4, **fields})


BAD_SAMPLES = {
    "zero batch": (_request(batch_size=0), grpc.StatusCode.INVALID_ARGUMENT, "batch_size"),
    "batch above capacity": (
        _request(batch_size=65),
        grpc.StatusCode.INVALID_ARGUMENT,
        "batch_size",
    ),
    "beta above 1": (_request(beta=1.5), grpc.StatusCode.INVALID_ARGUMENT, "beta"),
    "negative beta": (_request(beta=-0.1), grpc.StatusCode.INVALID_ARGUMENT, "beta"),
    "nan beta": (_request(beta=float("nan")), grpc.StatusCode.INVALID_ARGUMENT, "beta"),
    "unknown table": (_request(table="x"), grpc.StatusCode.NOT_FOUND, "table"),
}


@pytest.mark.parametrize("case", sorted(BAD_SAMPLES))
def test_bad_sample_is_refused_and_changes_nothing(replay_factory, case):
    request, code, field = BAD_SAMPLES[case]
    server = replay_factory(capacity=64)
    with server.client() as client:
        client.insert(transitions(20))
        before = server.table.digest()
        with pytest.raises(grpc.RpcError) as caught:
            client.stub.Sample(request, timeout=5)
        assert caught.value.code() == code
        assert field in caught.value.details()
        with pytest.raises(grpc.RpcError) as streamed:
            list(
                client.stub.SampleStream(replay_pb2.SampleStreamRequest(sample=request), timeout=5)
            )
        assert streamed.value.code() == code
        assert server.table.digest() == before


def test_sampling_all_zero_priorities_is_failed_precondition(replay):
    with replay.client() as client:
        client.insert(transitions(5), np.zeros(5))
        with pytest.raises(grpc.RpcError) as caught:
            client.sample(2)
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def _update(keys, priorities) -> replay_pb2.UpdatePrioritiesRequest:
    return replay_pb2.UpdatePrioritiesRequest(
        table="default", keys=_tensor(keys), priorities=_tensor(priorities)
    )


BAD_UPDATES = {
    "nan priority": (_update(np.array([1, 2]), np.array([np.nan, 1.0])), "priorities"),
    "negative priority": (_update(np.array([1, 2]), np.array([-1.0, 1.0])), "priorities"),
    "inf priority": (_update(np.array([1, 2]), np.array([np.inf, 1.0])), "priorities"),
    "negative key": (_update(np.array([-1, 2]), np.array([1.0, 1.0])), "keys"),
    "length mismatch": (_update(np.array([1, 2, 3]), np.array([1.0, 1.0])), "priorities"),
    "float keys": (_update(np.array([1.0, 2.0]), np.array([1.0, 1.0])), "keys"),
    "empty": (_update(np.zeros(0, np.int64), np.zeros(0)), "keys"),
    "compressed keys": (
        replay_pb2.UpdatePrioritiesRequest(
            table="default",
            keys=tensors.to_proto(codec.compress(np.array([1, 2], np.int64))),
            priorities=_tensor(np.ones(2)),
        ),
        "keys.codec",
    ),
    "garbage bytes": (
        replay_pb2.UpdatePrioritiesRequest(
            table="default",
            keys=tensor_pb2.Tensor(dtype=tensor_pb2.INT64, shape=[2], data=b"\x01\x02\x03"),
            priorities=_tensor(np.ones(2)),
        ),
        "keys.data",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_UPDATES))
def test_bad_priority_update_is_refused_and_changes_nothing(replay, case):
    request, field = BAD_UPDATES[case]
    with replay.client() as client:
        client.insert(transitions(10))
        before = replay.table.digest()
        with pytest.raises(grpc.RpcError) as caught:
            client.stub.UpdatePriorities(request, timeout=5)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
        assert field in caught.value.details()
        with pytest.raises(grpc.RpcError) as streamed:
            list(client.stub.UpdatePrioritiesStream(iter([request]), timeout=5))
        assert streamed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert field in streamed.value.details()
        assert replay.table.digest() == before


def test_priority_stream_answers_in_order_and_stops_at_a_refused_request(replay):
    """UpdatePrioritiesStream: one response per request, in order; a refused request ends the
    stream, the ones before it stay applied and the ones after it are not applied."""
    with replay.client() as client:
        client.insert(transitions(10))
        requests = [
            _update(np.array([1, 2]), np.array([5.0, 6.0])),
            _update(np.array([3, 42]), np.array([7.0, 1.0])),  # 42 was never written: stale
            _update(np.array([4]), np.array([-1.0])),  # refused
            _update(np.array([5]), np.array([9.0])),  # after the refusal: never read
        ]
        call = client.stub.UpdatePrioritiesStream(iter(requests), timeout=5)
        answers = []
        with pytest.raises(grpc.RpcError) as caught:
            for response in call:
                answers.append((response.updated, response.stale))
        info = client.info()  # applies what the replay staged
    assert answers == [(2, 0), (1, 1)]
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details().startswith("priorities")
    assert (info.priority_updates, info.stale_priority_updates) == (3, 1)
    np.testing.assert_array_equal(replay.table.priorities[[1, 2, 3, 4, 5]], [5, 6, 7, 1, 1])


def test_acked_stream_fails_only_the_refused_request_and_resends_the_rest(replay):
    """Requests pipelined on one AckedStream: the replay refuses the second; the first has its
    answer, the second its INVALID_ARGUMENT, the third (never read) StreamEnded, which reads
    as UNAVAILABLE, so ReplayClient sends it again on a new stream."""
    with replay.client() as client:
        client.insert(transitions(10))
        stream = AckedStream(client.stub.UpdatePrioritiesStream)
        futures = [
            stream.send(_update(np.array([1]), np.array([2.0]))),
            stream.send(_update(np.array([2]), np.array([np.nan]))),
            stream.send(_update(np.array([3]), np.array([4.0]))),
        ]
        assert AckedStream.ack(futures[0], 5).updated == 1
        with pytest.raises(grpc.RpcError) as refused:
            AckedStream.ack(futures[1], 5)
        with pytest.raises(StreamEnded) as unread:
            AckedStream.ack(futures[2], 5)
        with pytest.raises(StreamEnded):  # an ended stream takes nothing more
            AckedStream.ack(stream.send(_update(np.array([3]), np.array([4.0]))), 5)
        stream.close()
        info = client.info()
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert unread.value.code() == grpc.StatusCode.UNAVAILABLE
    assert info.priority_updates == 1
    assert replay.table.priorities[3] == 1.0  # the unread request changed nothing


def test_priority_updates_from_many_threads_share_one_stream(replay):
    """ReplayClient.update_priorities from 4 threads: every update lands and is counted once,
    over one UpdatePrioritiesStream call; a refused update among them fails only its caller."""
    errors: list[grpc.RpcError] = []
    with replay.client() as client:
        client.insert(transitions(100))

        def updates(offset: int) -> None:
            for i in range(50):
                keys = np.arange(offset, 100, 4)
                client.update_priorities(keys, np.full(len(keys), float(i + 1)))
                if offset == 0 and i == 25:
                    try:
                        client.update_priorities(np.array([0]), np.array([np.inf]))
                    except grpc.RpcError as err:
                        errors.append(err)

        threads = [threading.Thread(target=updates, args=(k,)) for k in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        info = client.info()
        started = stream_calls(replay.metrics_port, "UpdatePrioritiesStream")
    assert [err.code() for err in errors] == [grpc.StatusCode.INVALID_ARGUMENT]
    assert info.priority_updates == 4 * 50 * 25
    np.testing.assert_array_equal(replay.table.priorities[:100], np.full(100, 50.0))
    assert started == 2  # the refusal ended the first stream; the rest went on a second


def test_health_and_reflection(replay):
    assert health_status(replay.address) == health_pb2.HealthCheckResponse.SERVING
    assert (
        health_status(replay.address, "apexrl.v1.Replay") == health_pb2.HealthCheckResponse.SERVING
    )
    with grpc.insecure_channel(replay.address) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        response = next(stub.ServerReflectionInfo(iter([request]), timeout=5))
    names = {s.name for s in response.list_services_response.service}
    assert {"apexrl.v1.Replay", "grpc.health.v1.Health"} <= names


def test_metrics_endpoint(replay):
    with replay.client() as client:
        client.insert(transitions(40))
        client.sample(8)
        with pytest.raises(grpc.RpcError):
            client.sample(0)
    # A call's grpc_server_* sample is recorded when the server ends the call, which can be
    # just after the client has its response; the client's one Insert stream ends only when
    # the client closes, and the server may see that after the last Sample: wait for both.
    ended = (
        'grpc_server_handling_seconds_bucket{grpc_code="INVALID_ARGUMENT",grpc_method="Sample"',
        'grpc_server_handling_seconds_bucket{grpc_code="OK",grpc_method="Insert"',
    )
    text = wait_for(
        lambda: metrics_containing(replay.metrics_port, *ended), 10, " and ".join(ended)
    )
    assert 'apexrl_replay_size{table="default"} 40.0' in text
    assert 'apexrl_replay_inserts_total{table="default"} 40.0' in text
    assert 'apexrl_replay_samples_total{table="default"} 8.0' in text
    assert "apexrl_replay_sample_age_bucket" in text and "apexrl_replay_priority_bucket" in text
    assert (
        'grpc_server_handled_total{grpc_code="OK",grpc_method="Sample",'
        'grpc_service="apexrl.v1.Replay",grpc_type="unary"} 1.0'
    ) in text
    assert 'grpc_code="INVALID_ARGUMENT",grpc_method="Sample"' in text


def stream_calls(metrics_port: int, method: str) -> float:
    """Calls of `method` the replay has started (grpc_server_started_total)."""
    lines = [line for line in metrics_text(metrics_port).splitlines()
             if line.startswith("grpc_server_started_total") and f'grpc_method="{method}"' in line]  # fmt: skip
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines)


def test_inserts_share_one_stream_and_a_refused_one_does_not_poison_the_next(replay):
    """ReplayClient keeps one Insert stream open; a refused request ends that stream (as the
    contract says) and the next insert opens a new one."""
    with replay.client() as client:
        for start in range(0, 50, 5):
            client.insert(transitions(5, start=start))
        assert stream_calls(replay.metrics_port, "Insert") == 1
        bad = transitions(2, start=50) | {"reward": np.zeros(2, np.float64)}
        with pytest.raises(grpc.RpcError) as caught:
            client.insert(bad)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert client.insert(transitions(3, start=50)).table_size == 53
        assert stream_calls(replay.metrics_port, "Insert") == 2


@pytest.mark.parametrize("wait", [-1.0, float("nan")])
def test_insert_max_wait_must_be_a_duration(replay, wait):
    with replay.client(retry_seconds=0) as client:
        request = insert_request("default", transitions(2), None, wait)
        with pytest.raises(grpc.RpcError) as caught:
            list(client.stub.Insert(iter([request]), timeout=5))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details().startswith("max_wait_seconds")
    assert replay.table.size == 0


def test_writer_sends_single_transitions_in_pipelined_batches(replay):
    """ReplayWriter: 1,000 transitions appended one at a time land in order, acknowledged by
    flush; a refused batch raises and the batches after it still land."""
    rows = transitions(1000)
    with replay.client() as client:
        writer = client.writer(batch=64, window=4)
        for i in range(1000):
            writer.append({k: v[i] for k, v in rows.items()}, float(i % 7) + 0.5)
        assert writer.landed < 1000 or replay.table.size == 1000  # some may await their ack
        writer.flush()
        assert writer.landed == 1000 and replay.table.size == 1000
        np.testing.assert_array_equal(replay.table.columns["obs"][:1000], rows["obs"])
        np.testing.assert_array_equal(replay.table.priorities[:7], np.arange(7) + 0.5)

        good = {k: v[0] for k, v in transitions(1, start=5).items()}
        other = client.writer(batch=2, window=4)
        other.append(good, 1.0)
        other.append(good, 1.0)  # batch 1: good
        with pytest.raises(grpc.RpcError) as caught:
            other.append(good, -1.0)
            other.append(good, 1.0)  # batch 2: a negative priority
            other.append(good, 1.0)
            other.append(good, 1.0)  # batch 3: good, sent behind the refused one
            other.flush()
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        other.flush()  # batch 3 goes again on a new stream
        assert replay.table.size == 1004 and other.landed == 4
        # Window 1: the refusal surfaces while the next batch waits for room; that batch
        # stays buffered and goes with the next append or flush.
        third = client.writer(batch=2, window=1)
        for priority in (1.0, 1.0, -1.0, 1.0):
            third.append(good, priority)
        with pytest.raises(grpc.RpcError):
            third.append(good, 2.0)
            third.append(good, 2.0)
        third.flush()
        assert replay.table.size == 1008 and third.landed == 4
        assert replay.table.priorities[1006:1008].tolist() == [2.0, 2.0]
        for w in (writer, other, third):
            w.close()


def test_writer_delivers_at_least_once_doubling_at_most_a_window_per_lost_stream(
    replay_factory, monkeypatch
):
    """A stream that breaks after the replay applied batches whose acks never came back (here
    two: the replay inserts them, then the call ends UNAVAILABLE before their acks go out):
    the writer sends every unacknowledged batch again on a new stream. Every item lands, none
    is lost; the ones doubled are exactly those batches, and at most `window` batches can be
    doubled by one lost stream (their acks are all it can be waiting for)."""
    from apexrl.replay.server import ReplayServicer

    batch, window, acked_first, lost = 4, 3, 2, 2
    insert = ReplayServicer.Insert
    broken = []

    async def losing_acks(self, request_iterator, context):
        answered = 0
        async for response in insert(self, request_iterator, context):
            answered += 1
            if broken or answered <= acked_first:
                yield response
            elif answered == acked_first + lost:  # applied, their acks withheld: cut
                broken.append(True)
                await context.abort(grpc.StatusCode.UNAVAILABLE, "connection lost")

    monkeypatch.setattr(ReplayServicer, "Insert", losing_acks)
    replay = replay_factory()
    rows = transitions(40)
    with replay.client() as client:
        writer = client.writer(batch=batch, window=window)
        for i in range(40):
            writer.append({k: v[i] for k, v in rows.items()}, 1.0)
        writer.flush()
        writer.close()
    assert broken and writer.landed == 40
    stored = replay.table.columns["obs"][: replay.table.size, 0].astype(int)
    copies = np.bincount(stored, minlength=40)
    assert copies.min() == 1  # at least once
    doubled = np.flatnonzero(copies > 1)
    np.testing.assert_array_equal(
        doubled, np.arange(acked_first * batch, (acked_first + lost) * batch)
    )
    assert copies.max() == 2 and len(doubled) <= window * batch


def test_sigterm_ends_idle_streams_and_keeps_what_they_sent(service_process, tmp_path):
    """A client that keeps its insert and priority streams open between batches (every actor
    and learner does) does not hold the replay's stop for its grace: the streams end
    UNAVAILABLE between two requests, and what they sent before is in the final checkpoint."""
    from apexrl.replay.client import ReplayClient
    from tests.conftest import checkpoint_digest

    grace = 30.0
    replay = service_process(
        "replay", "--grace-seconds", str(grace), "--min-size-to-sample", "1",
        "--checkpoint-dir", str(tmp_path / "checkpoints"),
    )  # fmt: skip
    with ReplayClient(replay.address, timeout=10, retry_seconds=0) as client:
        first = client.insert(transitions(10)).first_key  # the Insert stream stays open
        client.update_priorities(first + np.arange(5), np.full(5, 3.0))  # and this one
        info = client.stub.Info(replay_pb2.InfoRequest(include_digest=True), timeout=10)
        started = time.monotonic()
        code = replay.terminate(timeout=grace + 10)
        seconds = time.monotonic() - started
    print(f"replay with two idle streams open stopped in {seconds:.2f} s (grace {grace:g} s)")
    assert code == 0 and seconds < grace / 3, replay.log()[-2000:]
    assert checkpoint_digest(tmp_path / "checkpoints") == info.tables[0].digest
