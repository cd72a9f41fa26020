"""The parameter relay (`apexrl relay`, docs/scaling.md#parameter-relay) between a real learner
servicer and its callers, every hop a real gRPC server on port 0: the relay serves the
learner's versions (bytes, lineage, change sets), never an older one after a newer one and
never one the learner did not publish; a lineage change passes through; actors fall back to the
learner when their relay dies; and the settings that cannot work stop with an error naming
them: a relay that reaches itself, an actor whose relay follows another learner, an actor whose
`learner` is a relay."""

import subprocess
import sys
import threading
import time
from contextlib import contextmanager

import grpc
import numpy as np
import prometheus_client
import pytest

from apexrl.actor import parameters as actor_parameters
from apexrl.actor.loop import ActorMetrics
from apexrl.actor.parameters import ParameterPuller
from apexrl.common import tensors
from apexrl.common.learner_client import LearnerClient
from apexrl.common.parameters import ParameterStore
from apexrl.common.ports import free_port
from apexrl.config import LearnerConfig, RelayConfig
from apexrl.relay import server as relay_server
from apexrl.v1 import learner_pb2, learner_pb2_grpc
from tests.conftest import metric, serve_learner, serving_in_thread, start_service, wait_for

SHAPES = {"torso.weight": (64, 4), "torso.bias": (64,), "head.weight": (2, 64)}


def network(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in SHAPES.items()}


def moved(arrays: dict[str, np.ndarray], seed: int) -> dict[str, np.ndarray]:
    """A few rows of the torso moved: the next version's change set is those rows."""
    rng = np.random.default_rng(seed)
    out = dict(arrays)
    weight = arrays["torso.weight"].copy()
    weight[rng.choice(64, 3, replace=False)] += 1.0
    out["torso.weight"] = weight
    return out


@contextmanager
def learner(tmp_path, store: ParameterStore):
    """The learner's real servicer (leases, long polls, encoded-once answers) on port 0."""
    config = LearnerConfig(checkpoint_dir=str(tmp_path / "ckpt"))
    with serve_learner(tmp_path, store, network(0), config) as (address, _):
        yield address


@contextmanager
def relay_in_thread(tmp_path, upstream: str, **settings):
    """`apexrl relay`'s service in a thread of the test; yields (address, relay, metrics port)."""
    ready = tmp_path / f"relay-{time.monotonic_ns()}.json"
    config = RelayConfig(
        host="127.0.0.1",
        port=0,
        metrics_port=0,
        grace_seconds=1.0,
        ready_file=str(ready),
        learner=upstream,
        **settings,
    )
    registry = prometheus_client.CollectorRegistry()
    service, relay = relay_server.build(config, registry)
    with serving_in_thread(config, service, registry) as ports:
        yield f"127.0.0.1:{ports['port']}", relay, ports["metrics_port"]


def raw(address: str, **request) -> learner_pb2.GetParametersResponse:
    with grpc.insecure_channel(address) as channel:
        stub = learner_pb2_grpc.LearnerStub(channel)
        return stub.GetParameters(learner_pb2.GetParametersRequest(**request), timeout=10)


def same(arrays: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> bool:
    return set(arrays) == set(want) and all(arrays[n].tobytes() == want[n].tobytes() for n in want)


def test_the_relay_serves_the_learners_bytes_lineage_and_change_sets(tmp_path, monkeypatch):
    store = ParameterStore()
    first = network(1)
    store.publish(first, update_step=10)
    with (
        learner(tmp_path, store) as upstream,
        relay_in_thread(tmp_path, upstream) as (
            address,
            relay,
            metrics_port,
        ),
    ):
        wait_for(lambda: relay.store.version == 1, 10, "the relay's first pull")
        mine, theirs = raw(address, actor_id="a"), raw(upstream)
        assert (mine.version, mine.lineage, mine.update_step, mine.algorithm) == (
            theirs.version, theirs.lineage, theirs.update_step, theirs.algorithm)  # fmt: skip
        assert mine.newest_version == theirs.newest_version == 1
        assert mine.parameters == theirs.parameters  # every tensor, bit for bit
        assert (mine.lease_seconds, mine.num_actors) == (0, 0), "a relay grants no lease"
        second = moved(first, 2)
        store.publish(second, update_step=20)
        wait_for(lambda: relay.store.version == 2, 10, "the relay's long poll")
        changes = raw(address, have_version=1, have_lineage=store.lineage, accept_changes=True)
        assert changes.changes_from == 1 and list(changes.rows) == ["torso.weight"]
        assert changes.ByteSize() < raw(address).ByteSize() / 4
        with LearnerClient(address) as client:  # the actor's client rebuilds the whole
            held = client.get_parameters()
            store.publish(moved(second, 3), update_step=30)
            wait_for(lambda: relay.store.version == 3, 10, "version 3 at the relay")
            newer = client.get_parameters(held.version, "a", held.lineage)
            assert newer.version == 3 and same(newer.arrays, moved(second, 3))
        with monkeypatch.context() as patch:  # encoded once, at arrival: never per caller
            patch.setattr(tensors, "to_proto", lambda *_: pytest.fail("a tensor encoded again"))
            for caller in ("b", "c"):
                assert raw(address, actor_id=caller).parameters == raw(upstream).parameters
                assert raw(address, have_version=2, have_lineage=store.lineage,
                           accept_changes=True).changes_from == 2  # fmt: skip
        lease = raw(upstream, actor_id="a", lease_only=True)  # the learner: a lease, no payload
        assert (lease.version, lease.lineage, lease.num_actors) == (3, store.lineage, 1)
        assert lease.lease_seconds == 30 and not lease.parameters and not lease.rows
        with pytest.raises(grpc.RpcError) as refused:
            raw(address, actor_id="a", lease_only=True)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "lease_only" in refused.value.details()
        with grpc.insecure_channel(address) as channel, pytest.raises(grpc.RpcError) as refused:
            change = learner_pb2.SetSettingRequest(name="learning_rate", value=1e-4)
            learner_pb2_grpc.LearnerStub(channel).SetSetting(change, timeout=10)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "send the change to the learner" in refused.value.details()
        assert metric(metrics_port, "apexrl_relay_versions_pulled_total") == 3
        assert metric(metrics_port, "apexrl_relay_parameter_bytes_served_total") > 0
        assert metric(metrics_port, "apexrl_relay_pull_seconds_count") == 3
        assert metric(metrics_port, "apexrl_relay_clients") >= 1


def test_only_published_versions_never_older_after_newer_lineage_changes_pass(tmp_path):
    """A caller polling the relay while the learner publishes 30 versions, then restarts from
    another checkpoint (a new lineage that reissues lower version numbers): everything served
    was published, with those very arrays, and within a lineage versions only go up."""
    store = ParameterStore()
    published: dict[tuple[int, int], dict] = {}

    def publish(arrays, version=None, lineage=None) -> None:
        v = store.publish(arrays, update_step=0, version=version, lineage=lineage)
        published[(v, store.lineage)] = arrays

    arrays = network(1)
    publish(arrays)
    seen: list[tuple[int, int, dict]] = []
    done = threading.Event()
    with (
        learner(tmp_path, store) as upstream,
        relay_in_thread(tmp_path, upstream) as (
            address,
            relay,
            _,
        ),
    ):

        def poll() -> None:
            with LearnerClient(address) as client:
                version = lineage = 0
                while not done.is_set():
                    params = client.get_parameters(version, "poller", lineage, wait_seconds=0.2)
                    if params.arrays:
                        seen.append((params.version, params.lineage, params.arrays))
                        version, lineage = params.version, params.lineage

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        first_lineage = store.lineage
        for k in range(30):
            arrays = moved(arrays, 10 + k)
            publish(arrays)
            if k % 3 == 0:  # the relay and the poller see some versions, skip others
                wait_for(lambda: relay.store.version == store.version, 10, "the relay")
        restarted = network(7)
        publish(restarted, version=12, lineage=first_lineage + 1)
        publish(moved(restarted, 99))
        wait_for(lambda: seen and seen[-1][:2] == (13, first_lineage + 1), 10, "the new lineage")
        done.set()
        poller.join(10)
    assert {lineage for _, lineage, _ in seen} == {first_lineage, first_lineage + 1}
    for version, lineage, got in seen:
        assert (version, lineage) in published, f"version {version} was never published"
        assert same(got, published[(version, lineage)]), f"version {version}: other arrays"
    for lineage in (first_lineage, first_lineage + 1):
        versions = [v for v, line, _ in seen if line == lineage]
        assert versions == sorted(set(versions)), f"a version went back: {versions}"
    # The old lineage ends before the new one starts: no answer of it after the change.
    lineages = [line for _, line, _ in seen]
    assert lineages == sorted(lineages, key=lambda line: line != first_lineage)
    assert seen[-1][0] == 13


@pytest.mark.parametrize("min_pull_seconds", [0.0, 0.3])
def test_min_pull_seconds_bounds_what_a_fast_learner_costs_a_relay(tmp_path, min_pull_seconds):
    """A learner publishing 40 versions over ~1.2 s: the relay takes each as it comes, or at
    most one per min_pull_seconds, and ends on the newest either way."""
    store = ParameterStore()
    arrays = network(1)
    store.publish(arrays, update_step=0)
    with (
        learner(tmp_path, store) as upstream,
        relay_in_thread(tmp_path, upstream, min_pull_seconds=min_pull_seconds) as (
            _,
            relay,
            metrics_port,
        ),
    ):
        wait_for(lambda: relay.store.version == 1, 10, "the relay's first pull")
        started = time.monotonic()
        for k in range(40):
            arrays = moved(arrays, k)
            store.publish(arrays, update_step=k)
            time.sleep(0.03)  # the learner's pace: a version every 30 ms
        wait_for(lambda: relay.store.version == 41, 10, "the newest version at the relay")
        pulled = metric(metrics_port, "apexrl_relay_versions_pulled_total") - 1
        elapsed = time.monotonic() - started
    if min_pull_seconds:
        assert pulled <= elapsed / min_pull_seconds + 1, (pulled, elapsed)
    else:
        assert pulled > elapsed / 0.3 + 1, (pulled, elapsed)  # the bound above would fail


def puller_with(learner_address: str, relays: list[str]) -> ParameterPuller:
    metrics = ActorMetrics(prometheus_client.CollectorRegistry(), "epsilon", "Epsilon.")
    return ParameterPuller(
        LearnerClient(learner_address, retry_seconds=1.0, retry_cap=0.1),
        "actor-1",
        metrics,
        [LearnerClient(address, retry_seconds=0.0) for address in relays],
    )


def pulled(puller: ParameterPuller):
    """Asks for a pull and returns its parameters (or the puller's error)."""
    puller.take()
    puller.request()
    wait_for(lambda: puller.arrived.is_set(), 15, "a pull")
    return puller.error or puller.take()


def test_actors_fall_back_to_the_learner_when_their_relay_is_killed(tmp_path):
    store = ParameterStore()
    arrays = network(1)
    store.publish(arrays, update_step=1)
    with learner(tmp_path, store) as upstream:
        relay = start_service(tmp_path, "relay", "--learner", upstream)
        wait_for(
            lambda: metric(relay.metrics_port, "apexrl_relay_versions_pulled_total") == 1,
            10,
            "the relay's first pull",
        )
        puller = puller_with(upstream, [relay.address])
        try:
            params = pulled(puller)
            assert params.version == 1 and same(params.arrays, arrays)
            # The parameters came from the relay, the place in the ladder from the learner.
            assert metric(relay.metrics_port, "apexrl_relay_answers_total") == 1
            assert (params.actor_index, params.num_actors) == (0, 1)
            assert params.exploration == pytest.approx(0.4) and params.lease_seconds == 30
            relay.kill()
            for version in (2, 3):
                arrays = moved(arrays, version)
                store.publish(arrays, update_step=version)
                params = pulled(puller)
                assert params.version == version and same(params.arrays, arrays)
                assert (params.actor_index, params.num_actors) == (0, 1)
            fallbacks = puller.metrics.registry.get_sample_value(
                "apexrl_actor_parameter_relay_fallbacks_total"
            )
            assert fallbacks == 1, "one round without relays"
            assert puller.error is None
        finally:
            puller.close()


def test_an_actor_whose_relay_follows_another_learner_stops_naming_both(tmp_path, monkeypatch):
    monkeypatch.setattr(actor_parameters, "LINEAGE_GRACE_SECONDS", 0.5)
    ours, other = ParameterStore(), ParameterStore()
    ours.publish(network(1), update_step=1)
    other.publish(network(2), update_step=1)
    with learner(tmp_path, ours) as ours_address, learner(tmp_path, other) as other_address:
        with relay_in_thread(tmp_path, other_address) as (relay_address, relay, _):
            wait_for(lambda: relay.store.version == 1, 10, "the relay's first pull")
            puller = puller_with(ours_address, [relay_address])
            try:
                first = pulled(puller)  # meanwhile the learner's own parameters
                assert first.lineage == ours.lineage and same(first.arrays, network(1))
                deadline = time.monotonic() + 10
                while puller.error is None and time.monotonic() < deadline:
                    pulled(puller)
                error = puller.error
            finally:
                puller.close()
    assert error is not None, "no error after the grace"
    message = str(error)
    assert message.startswith("parameters:") and relay_address in message
    assert ours_address in message and "`learner`" in message and "lineage" in message


@pytest.mark.parametrize("with_relays", [False, True], ids=["alone", "beside-relays"])
def test_an_actor_whose_learner_setting_is_a_relay_stops_naming_it(tmp_path, with_relays):
    store = ParameterStore()
    store.publish(network(1), update_step=1)
    with learner(tmp_path, store) as upstream:
        with relay_in_thread(tmp_path, upstream) as (relay_address, relay, _):
            wait_for(lambda: relay.store.version == 1, 10, "the relay's first pull")
            puller = puller_with(relay_address, [relay_address] if with_relays else [])
            try:
                error = pulled(puller)
            finally:
                puller.close()
    assert isinstance(error, ValueError), error
    assert str(error).startswith(f"learner: {relay_address} grants no lease")


def relay_command(port: int, upstream_port: int) -> subprocess.Popen:
    args = [sys.executable, "-m", "apexrl.cli", "relay", "--host", "127.0.0.1"]
    args += ["--port", str(port), "--metrics-port", "0"]
    args += ["--learner", f"127.0.0.1:{upstream_port}", "--log-level", "WARNING"]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("relays", [1, 2], ids=["pointed-at-itself", "a-loop-of-two"])
def test_a_relay_that_reaches_itself_stops_at_start_naming_the_setting(relays):
    ports = [free_port() for _ in range(relays)]
    processes = [relay_command(p, ports[(i + 1) % relays]) for i, p in enumerate(ports)]
    try:
        for process in processes:
            _, stderr = process.communicate(timeout=20)
            assert process.returncode == 2, stderr
            assert "apexrl relay: error: learner: 127.0.0.1:" in stderr, stderr
            assert "leads back to this relay" in stderr, stderr
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait(10)


def test_a_relay_stops_on_sigterm_answering_its_long_polls(tmp_path):
    store = ParameterStore()
    store.publish(network(1), update_step=1)
    with learner(tmp_path, store) as upstream:
        relay = start_service(tmp_path, "relay", "--learner", upstream)
        wait_for(
            lambda: metric(relay.metrics_port, "apexrl_relay_versions_pulled_total") == 1,
            10,
            "the relay's first pull",
        )
        with LearnerClient(relay.address) as client:
            held = client.get_parameters()
            answer = []
            poll = threading.Thread(
                target=lambda: answer.append(
                    client.get_parameters(held.version, "a", held.lineage, wait_seconds=30)
                )
            )
            poll.start()
            wait_for(
                lambda: (
                    metric(relay.metrics_port, "apexrl_relay_answers_total") == 1
                    and metric(relay.metrics_port, "grpc_server_started_total") >= 2
                ),
                10,
                "the long poll to arrive",
            )
            started = time.monotonic()
            relay.stop()  # SIGTERM, exit 0
            poll.join(10)
            assert answer and answer[0].version == 1 and not answer[0].arrays
            assert time.monotonic() - started < 5


def test_a_real_actor_carries_on_when_its_relay_is_killed(service_process):
    """Every service a real process: an actor pulling through a relay, its lease at the
    learner; the relay is killed and the actor goes on, its versions from the learner."""
    replay = service_process("replay", "--min-size-to-sample", "64")
    learner = service_process("learner", "--replay", replay.address, "--batch-size", "32",
                              "--publish-interval", "5")  # fmt: skip
    relay = service_process("relay", "--learner", learner.address)
    actor = service_process("actor", "--replay", replay.address, "--learner", learner.address,
                            "--parameters", relay.address, "--num-envs", "2",
                            "--insert-batch", "16", "--pull-interval", "50")  # fmt: skip

    def actor_metric(name: str) -> float:
        return metric(actor.metrics_port, f"apexrl_actor_{name}")

    wait_for(
        lambda: (
            actor_metric("parameter_version") > 1
            and metric(relay.metrics_port, "apexrl_relay_answers_total") >= 2
        ),
        60,
        "the actor on trained versions, through the relay",
    )
    assert metric(learner.metrics_port, "apexrl_learner_live_actors") == 1  # its lease
    assert actor_metric("epsilon") == pytest.approx(0.4)
    relay.kill()  # SIGKILL: no goodbye
    version, steps = actor_metric("parameter_version"), actor_metric("env_steps_total")
    wait_for(
        lambda: (
            actor_metric("parameter_relay_fallbacks_total") == 1
            and actor_metric("parameter_version") > version
            and actor_metric("env_steps_total") > steps
        ),
        60,
        "the actor acting on newer versions from the learner",
    )
    assert actor_metric("parameter_pull_failures_total") == 0
    assert metric(learner.metrics_port, "apexrl_learner_live_actors") == 1
    for proc in (actor, learner, replay):
        proc.stop()
