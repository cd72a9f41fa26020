"""TLS and mutual TLS on the gRPC hops, with certificates made here for the test: who may
connect, which role each client certificate names and which methods that role may call (every
role against every rpc of replay and the learner), and /metrics over TLS."""

import datetime
import http.client
import ipaddress
import ssl
import urllib.request
from collections.abc import Callable
from pathlib import Path

import grpc
import numpy as np
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from apexrl.common import tensors
from apexrl.common.client import channel_credentials
from apexrl.config import ClientTLSConfig
from apexrl.replay.client import ReplayClient, insert_request
from apexrl.v1 import learner_pb2, learner_pb2_grpc, replay_pb2, replay_pb2_grpc
from tests.conftest import in_process_replay, serve_learner, transitions, wait_for

ENV = "CartPole-v1"


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _issue(subject: str, issuer_key, issuer_name, *, ca: bool, server: bool = False, sans=()):
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer_name or _name(subject))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    names = list(sans)
    if server:
        names += [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    cert = builder.sign(issuer_key or key, hashes.SHA256())
    return key, cert


def _write(directory: Path, name: str, key, cert) -> tuple[str, str]:
    key_path, cert_path = directory / f"{name}.key", directory / f"{name}.pem"
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return str(key_path), str(cert_path)


CLIENT_SANS = {
    "actor": [x509.DNSName("actor"), x509.DNSName("actor.apexrl.svc")],
    "learner": [x509.UniformResourceIdentifier("spiffe://cluster.local/ns/apexrl/sa/learner")],
    "evaluator": [x509.DNSName("evaluator.apexrl")],
    "admin": [x509.DNSName("admin")],
    "nobody": [x509.DNSName("mallory.example"), x509.UniformResourceIdentifier("https://x/actor")],
    "two roles": [x509.DNSName("actor"), x509.DNSName("learner")],
}


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA, a server certificate for 127.0.0.1, a client certificate, and a stranger's CA."""
    directory = tmp_path_factory.mktemp("pki")
    ca_key, ca_cert = _issue("apexrl test CA", None, None, ca=True)
    files = {"ca": _write(directory, "ca", ca_key, ca_cert)}
    files["server"] = _write(
        directory, "server", *_issue("replay", ca_key, ca_cert.subject, ca=False, server=True)
    )
    # Client certificates by the role their SANs name, as the mtls overlay's (DNS) or a
    # service mesh's (SPIFFE URI) carry it; "nobody" names no role, "two roles" two.
    for name, sans in CLIENT_SANS.items():
        files[name] = _write(directory, name, *_issue(name, ca_key, ca_cert.subject, ca=False,
                                                      sans=sans))  # fmt: skip
    other_key, other_cert = _issue("someone else's CA", None, None, ca=True)
    files["stranger"] = _write(
        directory, "stranger", *_issue("mallory", other_key, other_cert.subject, ca=False)
    )
    return files


@pytest.fixture
def mtls_replay(tmp_path, pki):
    server_key, server_cert = pki["server"]
    settings = dict(tls_cert=server_cert, tls_key=server_key, tls_client_ca=pki["ca"][1])
    with in_process_replay(tmp_path, **settings) as harness:
        yield harness


def _client(address: str, tls: ClientTLSConfig | None) -> ReplayClient:
    return ReplayClient(address, timeout=5, retry_seconds=0, tls=tls)


def _role_tls(pki, role: str) -> ClientTLSConfig:
    key, cert = pki[role]
    return ClientTLSConfig(tls_ca=pki["ca"][1], tls_client_cert=cert, tls_client_key=key)


def test_client_with_a_valid_certificate_is_served(mtls_replay, pki):
    with _client(mtls_replay.address, _role_tls(pki, "actor")) as actor:
        actor.insert(transitions(8))
    with _client(mtls_replay.address, _role_tls(pki, "learner")) as learner:
        assert learner.sample(4).keys.shape == (4,)
    assert mtls_replay.table.size == 8


@pytest.mark.parametrize(
    "who", ["no client certificate", "certificate from another CA", "plaintext"]
)
def test_others_are_refused(mtls_replay, pki, who):
    if who == "plaintext":
        tls = None
    elif who == "no client certificate":
        tls = ClientTLSConfig(tls_ca=pki["ca"][1])
    else:
        key, cert = pki["stranger"]
        tls = ClientTLSConfig(tls_ca=pki["ca"][1], tls_client_cert=cert, tls_client_key=key)
    with _client(mtls_replay.address, tls) as client:
        with pytest.raises(grpc.RpcError) as caught:
            client.insert(transitions(8))
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert mtls_replay.table.size == 0


def test_server_tls_without_client_certificates(tmp_path, pki):
    server_key, server_cert = pki["server"]
    with in_process_replay(tmp_path, tls_cert=server_cert, tls_key=server_key) as server:
        with _client(server.address, ClientTLSConfig(tls_ca=pki["ca"][1])) as client:
            assert client.insert(transitions(3)).table_size == 3
        with _client(server.address, None) as plaintext, pytest.raises(grpc.RpcError):
            plaintext.insert(transitions(3))
        assert server.table.size == 3


def test_half_configured_tls_is_an_error(tmp_path, pki):
    with pytest.raises(ValueError, match="tls_cert and tls_key"):
        with in_process_replay(tmp_path, tls_client_ca=pki["ca"][1]):
            pass
    with pytest.raises(ValueError, match="tls_client_cert and tls_client_key"):
        _client(
            "127.0.0.1:1", ClientTLSConfig(tls_ca=pki["ca"][1], tls_client_cert=pki["actor"][1])
        )


def test_learner_and_actor_talk_to_a_mutual_tls_replay(service_process, pki):
    """Every hop: actor -> replay, learner -> replay, actor -> learner, all mutual TLS, each
    client with its own role's certificate, each call within what its role may call."""
    server_key, server_cert = pki["server"]
    serve = ("--tls-cert", server_cert, "--tls-key", server_key, "--tls-client-ca", pki["ca"][1])

    def connect(role: str) -> tuple[str, ...]:
        key, cert = pki[role]
        return ("--tls-ca", pki["ca"][1], "--tls-client-cert", cert, "--tls-client-key", key)

    replay = service_process("replay", "--min-size-to-sample", "64", *serve)
    learner = service_process(
        "learner", "--replay", replay.address, "--batch-size", "32", *serve, *connect("learner")
    )
    actor = service_process("actor", "--replay", replay.address, "--learner", learner.address,
                            "--num-envs", "2", "--insert-batch", "16", *connect("actor"))  # fmt: skip
    key, cert = pki["learner"]
    tls = ClientTLSConfig(tls_ca=pki["ca"][1], tls_client_cert=cert, tls_client_key=key)

    with ReplayClient(replay.address, tls=tls) as client:
        wait_for(
            lambda: client.info().samples > 0, 90, "the learner sampling what the actor inserted"
        )
        wait_for(lambda: client.info().priority_updates > 0, 30, "priorities from the learner")
    for proc in (actor, learner, replay):
        proc.stop()


# --- per-RPC authorization by the role in the client certificate ---------------------------

ROLES = ["actor", "learner", "evaluator", "admin"]
ALLOWED = {
    "actor": {"Replay/Insert", "Replay/Info", "Learner/GetParameters"},
    "learner": {"Replay/Sample", "Replay/SampleStream", "Replay/UpdatePriorities",
                "Replay/UpdatePrioritiesStream", "Replay/Info", "Replay/Checkpoint"},
    "evaluator": {"Learner/GetParameters", "Learner/ReportEvaluation"},
    "admin": {"Learner/SetSetting"},
}  # fmt: skip


def _channel(address: str, pki, role: str) -> grpc.Channel:
    return grpc.secure_channel(address, channel_credentials(_role_tls(pki, role)))


def _replay_calls(stub, keys: np.ndarray) -> dict[str, Callable[[], object]]:
    """One call of every Replay rpc, each of a kind that would change the table if run."""
    sample = replay_pb2.SampleRequest(table="default", batch_size=2, beta=0.4)
    update = replay_pb2.UpdatePrioritiesRequest(table="default")
    tensors.to_proto(keys, update.keys)
    tensors.to_proto(np.full(len(keys), 7.0), update.priorities)
    insert = insert_request("default", transitions(4), None)
    return {
        "Insert": lambda: list(stub.Insert(iter([insert]), timeout=10)),
        "Sample": lambda: stub.Sample(sample, timeout=10),
        "SampleStream": lambda: list(
            stub.SampleStream(
                replay_pb2.SampleStreamRequest(sample=sample, max_batches=1), timeout=10
            )
        ),  # fmt: skip
        "UpdatePriorities": lambda: stub.UpdatePriorities(update, timeout=10),
        "UpdatePrioritiesStream": lambda: list(
            stub.UpdatePrioritiesStream(iter([update]), timeout=10)
        ),  # fmt: skip
        "Info": lambda: stub.Info(replay_pb2.InfoRequest(), timeout=10),
        "Checkpoint": lambda: stub.Checkpoint(replay_pb2.CheckpointRequest(), timeout=10),
    }


def denied(metrics_port: int) -> dict[tuple[str, str], float]:
    """apexrl_authz_denied_total by (role, method), as scraped."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read()
    return {
        (sample.labels["role"], sample.labels["grpc_method"]): sample.value
        for family in text_string_to_metric_families(text.decode())
        if family.name == "apexrl_authz_denied"
        for sample in family.samples
        if sample.name == "apexrl_authz_denied_total"
    }


def _code(call: Callable[[], object]) -> tuple[grpc.StatusCode, str]:
    try:
        call()
    except grpc.RpcError as err:
        return err.code(), err.details()
    return grpc.StatusCode.OK, ""


@pytest.fixture
def authorized_replay(tmp_path, pki):
    """A mutual-TLS replay holding 16 items, checkpointing into tmp_path/ckpt."""
    server_key, server_cert = pki["server"]
    settings = dict(tls_cert=server_cert, tls_key=server_key, tls_client_ca=pki["ca"][1],
                    checkpoint_dir=str(tmp_path / "ckpt"))  # fmt: skip
    with in_process_replay(tmp_path, **settings) as harness:
        with _client(harness.address, _role_tls(pki, "actor")) as actor:
            actor.insert(transitions(16))
        yield harness


def _replay_state(harness, tmp_path) -> tuple:
    return harness.table.digest(), sorted(p.name for p in (tmp_path / "ckpt").glob("*"))


@pytest.mark.parametrize("role", ROLES)
def test_each_role_may_call_only_its_replay_methods(authorized_replay, pki, tmp_path, role):
    """Every Replay rpc with the role's certificate: PERMISSION_DENIED naming the role and the
    method for those it may not call, the table and its checkpoints unchanged; the others are
    served."""
    keys = authorized_replay.table.slot_keys[:4].astype(np.int64)
    denied_counts = {}
    with _channel(authorized_replay.address, pki, role) as channel:
        calls = _replay_calls(replay_pb2_grpc.ReplayStub(channel), keys)
        for method, call in calls.items():
            before = _replay_state(authorized_replay, tmp_path)
            code, details = _code(call)
            if f"Replay/{method}" in ALLOWED[role]:
                assert code == grpc.StatusCode.OK, (role, method, code, details)
                continue
            assert code == grpc.StatusCode.PERMISSION_DENIED, (role, method, code)
            assert f"role {role!r}" in details and f"apexrl.v1.Replay/{method}" in details
            assert _replay_state(authorized_replay, tmp_path) == before, (role, method)
            denied_counts[method] = denied_counts.get(method, 0) + 1
    # Each refusal is counted under its role and method.
    assert denied(authorized_replay.metrics_port) == {
        (role, f"apexrl.v1.Replay/{method}"): count for method, count in denied_counts.items()
    }


@pytest.mark.parametrize("who", ["nobody", "two roles"])
def test_a_certificate_without_one_recognised_role_is_refused(authorized_replay, pki, tmp_path,
                                                              who):  # fmt: skip
    before = _replay_state(authorized_replay, tmp_path)
    with _channel(authorized_replay.address, pki, who) as channel:
        for method, call in _replay_calls(
            replay_pb2_grpc.ReplayStub(channel), np.zeros(1, np.int64)
        ).items():
            code, details = _code(call)
            assert code == grpc.StatusCode.PERMISSION_DENIED, (who, method, code)
            assert "client certificate" in details and "role" in details, details
        # Health stays open to every caller the CA admitted.
        health = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=10
        )
        assert health.status == health_pb2.HealthCheckResponse.SERVING
    assert _replay_state(authorized_replay, tmp_path) == before


def _report(arrays: dict, version: int) -> learner_pb2.ReportEvaluationRequest:
    request = learner_pb2.ReportEvaluationRequest(version=version, returns=[100.0, 120.0],
                                                  env=ENV)  # fmt: skip
    for name, array in arrays.items():
        tensors.to_proto(array, request.parameters[name])
    return request


@pytest.mark.parametrize("role", ROLES)
def test_each_role_may_call_only_its_learner_methods(tmp_path, pki, role):
    """GetParameters (with an actor id: it takes a lease) and ReportEvaluation (a score that
    would become the best model) from each role: refused ones leave no lease and no best
    model behind."""
    from apexrl import algorithms
    from apexrl.algorithms.networks import state_to_numpy
    from apexrl.common.parameters import ParameterStore
    from apexrl.config import LearnerConfig

    config = LearnerConfig(algorithm="ppo", env=ENV, checkpoint_dir=str(tmp_path / "ckpt"))
    arrays = state_to_numpy(algorithms.make(config).network())
    store = ParameterStore(history_bytes=0)
    store.publish(arrays, update_step=0)
    server_key, server_cert = pki["server"]
    tls = dict(tls_cert=server_cert, tls_key=server_key, tls_client_ca=pki["ca"][1])
    with serve_learner(tmp_path, store, arrays, config, **tls) as (address, servicer):
        with _channel(address, pki, role) as channel:
            stub = learner_pb2_grpc.LearnerStub(channel)
            pull = learner_pb2.GetParametersRequest(actor_id="caller")
            code, details = _code(lambda: stub.GetParameters(pull, timeout=10))
            report = _report(arrays, store.version)
            report_code, report_details = _code(lambda: stub.ReportEvaluation(report, timeout=10))
            change = learner_pb2.SetSettingRequest(name="learning_rate", value=1e-4)
            set_code, set_details = _code(lambda: stub.SetSetting(change, timeout=10))
        with _channel(address, pki, "actor") as channel:
            # The lease count an allowed actor sees: 1 plus the caller's, had it been leased.
            witness = learner_pb2.GetParametersRequest(actor_id="witness")
            lease = learner_pb2_grpc.LearnerStub(channel).GetParameters(witness, timeout=10)
        best_version = servicer.best.version
    # A servicer without a training loop answers an allowed SetSetting FAILED_PRECONDITION.
    answered = {"SetSetting": grpc.StatusCode.FAILED_PRECONDITION}
    for method, got, text in (("GetParameters", code, details),
                              ("ReportEvaluation", report_code, report_details),
                              ("SetSetting", set_code, set_details)):  # fmt: skip
        if f"Learner/{method}" in ALLOWED[role]:
            assert got == answered.get(method, grpc.StatusCode.OK), (role, method, got, text)
        else:
            assert got == grpc.StatusCode.PERMISSION_DENIED, (role, method, got)
            assert f"role {role!r}" in text and f"apexrl.v1.Learner/{method}" in text, text
    assert lease.num_actors == (2 if "Learner/GetParameters" in ALLOWED[role] else 1)
    kept = "Learner/ReportEvaluation" in ALLOWED[role]
    assert best_version == (store.version if kept else 0), role


# --- /metrics over TLS ---------------------------------------------------------------------


def test_metrics_over_tls_refuse_plaintext_and_strangers(tmp_path, pki):
    """With a metrics certificate, /metrics speaks TLS only; with a metrics client CA too, a
    scraper must present a certificate that CA signed."""
    server_key, server_cert = pki["server"]
    settings = dict(metrics_tls_cert=server_cert, metrics_tls_key=server_key,
                    metrics_client_ca=pki["ca"][1])  # fmt: skip
    with in_process_replay(tmp_path, **settings) as harness:
        url = f"127.0.0.1:{harness.metrics_port}/metrics"
        with pytest.raises((OSError, http.client.HTTPException)):
            urllib.request.urlopen(f"http://{url}", timeout=5).read()

        def scrape(client: str | None) -> bytes:
            context = ssl.create_default_context(cafile=pki["ca"][1])
            if client is not None:
                key, cert = pki[client]
                context.load_cert_chain(cert, key)
            with urllib.request.urlopen(f"https://{url}", timeout=5, context=context) as got:
                return got.read()

        with pytest.raises(OSError):  # no client certificate
            scrape(None)
        with pytest.raises(OSError):  # a certificate another CA signed
            scrape("stranger")
        assert b"apexrl_replay_size" in scrape("actor")


def test_half_configured_metrics_tls_is_an_error(tmp_path, pki):
    with pytest.raises(ValueError, match="metrics_tls_cert and metrics_tls_key"):
        with in_process_replay(tmp_path, metrics_tls_cert=pki["server"][1]):
            pass
