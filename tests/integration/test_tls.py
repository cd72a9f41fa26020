"""TLS and mutual TLS on the gRPC hops, with certificates made here for the test."""

import datetime
import ipaddress
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from apexrl.config import ClientTLSConfig
from apexrl.replay.client import ReplayClient
from tests.conftest import in_process_replay, transitions, wait_for


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _issue(subject: str, issuer_key, issuer_name, *, ca: bool, server: bool = False):
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
    if server:
        names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
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


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA, a server certificate for 127.0.0.1, a client certificate, and a stranger's CA."""
    directory = tmp_path_factory.mktemp("pki")
    ca_key, ca_cert = _issue("apexrl test CA", None, None, ca=True)
    files = {"ca": _write(directory, "ca", ca_key, ca_cert)}
    files["server"] = _write(
        directory, "server", *_issue("replay", ca_key, ca_cert.subject, ca=False, server=True)
    )
    files["client"] = _write(
        directory, "client", *_issue("actor", ca_key, ca_cert.subject, ca=False)
    )
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


def test_client_with_a_valid_certificate_is_served(mtls_replay, pki):
    key, cert = pki["client"]
    tls = ClientTLSConfig(tls_ca=pki["ca"][1], tls_client_cert=cert, tls_client_key=key)
    with _client(mtls_replay.address, tls) as client:
        client.insert(transitions(8))
        assert client.sample(4).keys.shape == (4,)
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
            "127.0.0.1:1", ClientTLSConfig(tls_ca=pki["ca"][1], tls_client_cert=pki["client"][1])
        )


def test_learner_and_actor_talk_to_a_mutual_tls_replay(service_process, pki):
    """Every hop: actor -> replay, learner -> replay, actor -> learner, all mutual TLS."""
    server_key, server_cert = pki["server"]
    client_key, client_cert = pki["client"]
    serve = ("--tls-cert", server_cert, "--tls-key", server_key, "--tls-client-ca", pki["ca"][1])
    connect = (
        "--tls-ca",
        pki["ca"][1],
        "--tls-client-cert",
        client_cert,
        "--tls-client-key",
        client_key,
    )
    replay = service_process("replay", "--min-size-to-sample", "64", *serve)
    learner = service_process(
        "learner", "--replay", replay.address, "--batch-size", "32", *serve, *connect
    )
    actor = service_process("actor", "--replay", replay.address, "--learner", learner.address,
                            "--num-envs", "2", "--insert-batch", "16", *connect)  # fmt: skip
    tls = ClientTLSConfig(
        tls_ca=pki["ca"][1], tls_client_cert=client_cert, tls_client_key=client_key
    )

    with ReplayClient(replay.address, tls=tls) as client:
        wait_for(
            lambda: client.info().samples > 0, 90, "the learner sampling what the actor inserted"
        )
        wait_for(lambda: client.info().priority_updates > 0, 30, "priorities from the learner")
    for proc in (actor, learner, replay):
        proc.stop()
