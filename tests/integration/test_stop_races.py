"""A stop is a stop, a server going away is an outage: the calls in flight when either happens.

A replay that stops ends the calls it still serves once its grace is over (serving.stop_server:
grpc's stop(0)), and the caller reads CANCELLED, as it does when its own process stops and
closes the channel under the call. The first is an outage: the client retries it on the next
server, as it retries UNAVAILABLE (a learner crashed on it, exit 1, when the replay restarted
while a Sample was in flight). The second is the caller's own: raised at once, never retried,
and a learner's dataset ends quietly on it.

The replay here holds every call it receives until its server stops, so each call is in
flight at the stop, every time.
"""

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import prometheus_client
import pytest

from apexrl.algorithms.datasets import exact_batches
from apexrl.common.serving import Service
from apexrl.replay import server as replay_server
from apexrl.replay.client import ReplayClient
from apexrl.v1 import replay_pb2, replay_pb2_grpc
from tests.conftest import in_process_replay, serve_in_thread, transitions, wait_for


class Held(replay_pb2_grpc.ReplayServicer):
    """A replay that holds every call until its server stops, which cancels them (as the
    replay's own stop cancels its sample streams: ReplayServicer.stop_waiters)."""

    def __init__(self):
        self.entered = threading.Event()
        self.held: set[asyncio.Task] = set()

    async def _hold(self):
        self.held.add(asyncio.current_task())
        self.entered.set()
        await asyncio.Event().wait()

    async def cancel_held(self) -> None:
        for task in self.held:
            task.cancel()

    async def Sample(self, request, context):
        await self._hold()

    async def SampleStream(self, request, context):
        await self._hold()
        yield replay_pb2.SampleResponse()  # never reached

    async def Insert(self, request_iterator, context):
        async for _ in request_iterator:
            await self._hold()
        yield replay_pb2.InsertResponse()  # never reached

    async def UpdatePrioritiesStream(self, request_iterator, context):
        async for _ in request_iterator:
            await self._hold()
        yield replay_pb2.UpdatePrioritiesResponse()  # never reached


def held_replay(tmp_path, port: int = 0):
    held = Held()

    def register(server) -> list[str]:
        replay_pb2_grpc.add_ReplayServicer_to_server(held, server)
        return [replay_pb2.DESCRIPTOR.services_by_name["Replay"].full_name]

    registry = prometheus_client.CollectorRegistry()
    service = Service(register=register, on_shutdown=held.cancel_held)
    serving = serve_in_thread(tmp_path, service, registry, port=port, grace_seconds=0.2)
    return held, serving


class FirstCancelled:
    """The first call of a replay rpc is held until the test releases it, then answered
    CANCELLED, as a stopping server's stop(0) answers the calls in flight (when its GOAWAY
    does not reach the client first: then they read UNAVAILABLE); calls before it is armed
    and after that first one pass."""

    def __init__(self, monkeypatch, rpc: str):
        self.entered = threading.Event()
        self.release = threading.Event()
        self.armed = False
        original = getattr(replay_server.ReplayServicer, rpc)
        gate = self

        async def hold(context) -> None:
            if gate.armed:
                gate.armed = False
                gate.entered.set()
                await asyncio.to_thread(gate.release.wait, 10)
                await context.abort(grpc.StatusCode.CANCELLED, "CANCELLED")

        async def unary(servicer, request, context):
            await hold(context)
            return await original(servicer, request, context)

        async def streaming(servicer, request, context):
            await hold(context)
            async for response in original(servicer, request, context):
                yield response

        wrapper = unary if rpc == "Sample" else streaming
        monkeypatch.setattr(replay_server.ReplayServicer, rpc, wrapper)


# Each verb as a caller makes it, the rpc that carries it, and its result.
VERBS = {
    "sample": ("Sample", lambda client, key: client.sample(4).keys.tolist()),
    "sample_stream": (
        "SampleStream",
        lambda client, key: next(client.sample_stream(4)).keys.tolist(),
    ),
    "insert": ("Insert", lambda client, key: client.insert(transitions(3)).inserted),
    "update_priorities": (
        "UpdatePrioritiesStream",
        lambda client, key: client.update_priorities(np.array([key]), np.array([7.0])).updated,
    ),
}


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_a_call_the_server_cancels_is_made_again(tmp_path, monkeypatch, verb):
    rpc, make = VERBS[verb]
    gate = FirstCancelled(monkeypatch, rpc)
    with in_process_replay(tmp_path, min_size_to_sample=1) as replay:
        with replay.client() as filler:
            key = filler.insert(transitions(8)).first_key
        gate.armed = True
        with ThreadPoolExecutor(1) as call:
            client = ReplayClient(replay.address, timeout=10.0, retry_seconds=30.0, retry_cap=0.2)
            future = call.submit(lambda: make(client, key))
            wait_for(gate.entered.is_set, 10, f"{verb} held by the replay")
            gate.release.set()
            try:
                outcome = future.result(timeout=20)
            finally:
                client.close()
        if verb == "insert":
            assert outcome == 3 and replay.table.size == 8 + 3
        elif verb == "update_priorities":
            slot = int(np.flatnonzero(replay.table.slot_keys == key)[0])
            assert outcome == 1 and replay.table.priorities[slot] == pytest.approx(7.0)
        else:
            assert len(outcome) == 4
            assert set(outcome) <= set(replay.table.slot_keys.tolist())


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_a_call_its_own_stop_cancels_is_not_retried(tmp_path, verb):
    """The process stops and closes its client: the call in flight ends at once (CANCELLED,
    or a stream that just ends), though the replay would hold it and retries are allowed."""
    held, serving = held_replay(tmp_path)
    with serving as address:
        stop = threading.Event()
        client = ReplayClient(address, timeout=10.0, retry_seconds=30.0, stop=stop)
        with ThreadPoolExecutor(1) as call:
            future = call.submit(lambda: VERBS[verb][1](client, 1))
            wait_for(held.entered.is_set, 10, f"{verb} held by the replay")
            stop.set()
            client.close()
            started = time.monotonic()
            if verb == "sample_stream":  # a stream ends: the prefetch thread ends quietly
                with pytest.raises(StopIteration):
                    future.result(timeout=5)
            else:
                with pytest.raises(grpc.RpcError) as raised:
                    future.result(timeout=5)
                assert raised.value.code() == grpc.StatusCode.CANCELLED
            assert time.monotonic() - started < 1.0


def test_a_queue_dataset_stopped_while_it_samples_ends_quietly(tmp_path):
    """ppo's dataset samples in the training thread: a stop during its Sample ends the batches,
    it does not raise (the learner exited 1 on SIGTERM)."""
    held, serving = held_replay(tmp_path)
    with serving as address:
        stop = threading.Event()
        client = ReplayClient(address, timeout=10.0, retry_seconds=None, stop=stop)
        with ThreadPoolExecutor(1) as call:
            future = call.submit(lambda: list(exact_batches(client, lambda: 4, 0.4, stop)))
            wait_for(held.entered.is_set, 10, "the dataset's Sample held by the replay")
            stop.set()
            client.close()
            assert future.result(timeout=5) == []


def test_samplers_admitted_by_the_rate_limiter_never_meet_a_drained_queue(tmp_path):
    """A sampler the rate limiter admits samples at once: a call arriving in between cannot
    take its items (a woken sampler used to resume a loop step later, and 8 samplers beside
    a writer were answered FAILED_PRECONDITION "table is empty" ~5 times a second)."""
    settings = dict(rate_limiter="queue", remover="none", max_times_sampled=1, sampler="fifo")
    with in_process_replay(tmp_path, capacity=1000, **settings) as replay:
        stop = threading.Event()
        codes: list = []

        def sample() -> int:
            sampled = 0
            with replay.client(timeout=0.5) as client:
                while not stop.is_set():
                    try:
                        sampled += len(client.sample(16).keys)
                    except grpc.RpcError as err:
                        if err.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                            codes.append(err.code())
            return sampled

        with ThreadPoolExecutor(8) as pool, replay.client() as writer:
            samplers = [pool.submit(sample) for _ in range(8)]
            inserted, until = 0, time.monotonic() + 1.5
            while time.monotonic() < until:
                inserted += writer.insert(transitions(8)).inserted
            stop.set()
            sampled = sum(f.result(timeout=10) for f in samplers)
    assert codes == []
    assert sampled > 0 and sampled + replay.table.size == inserted
