"""deploy/kustomize/overlays/mtls: mutual TLS on every gRPC hop, certificates from Secrets.

The overlay gets the generic checks of test_manifests.py (reused from there; two are replaced
here: its gRPC probes become TCP ones, and its pods mount Secrets), then: every TLS setting of
every service is set (parsed by apexrl.config), every file it names is a key of the pod's own
mounted Secret, and a real `apexrl replay` started with the rendered settings serves a client
holding the learner's settings, with throwaway certificates for the Service names.
"""

import copy
import dataclasses
import datetime
import http.client
import inspect
import os
import socket
import ssl
import urllib.request
from pathlib import Path, PurePosixPath

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from apexrl import config as cfg
from apexrl.common.client import channel_credentials
from apexrl.replay import sharded
from apexrl.v1 import replay_pb2, replay_pb2_grpc
from tests.conftest import start_service
from tests.deploy import test_manifests as tm

OVERLAY = "overlays/mtls"
README = tm.KUSTOMIZE / OVERLAY / "README.md"
SERVER_TLS = {"tls_cert", "tls_key", "tls_client_ca"}
CLIENT_TLS = {"tls_ca", "tls_client_cert", "tls_client_key"}
# Every pod serves /metrics over TLS with its own certificate (scrapers need no certificate:
# the NetworkPolicies admit the monitoring namespace only).
METRICS_TLS = {"metrics_tls_cert", "metrics_tls_key"}
# The Secret key each setting must name (cert-manager's shape: tls.crt, tls.key, ca.crt).
SECRET_KEY = {
    "tls_cert": "tls.crt",
    "tls_key": "tls.key",
    "tls_client_ca": "ca.crt",
    "tls_ca": "ca.crt",
    "tls_client_cert": "tls.crt",
    "tls_client_key": "tls.key",
    "metrics_tls_cert": "tls.crt",
    "metrics_tls_key": "tls.key",
}
CLIENTS = {"learner", "relay", "actor", "evaluator"}

# test_manifests.py checks that take a bundle: run here as they are, or replaced below.
GENERIC = [
    tm.test_every_resource_is_in_the_namespace,
    tm.test_workload_selectors_match_pod_labels,
    tm.test_services_select_one_workload_and_target_its_ports,
    tm.test_ports_and_paths_match_what_the_code_reads,
    tm.test_every_flag_and_env_var_is_a_setting_of_the_service,
    tm.test_images_are_named_consistently,
    tm.test_learner_is_one_replica_replaced_whole,
    tm.test_replay_is_a_statefulset_of_shards_behind_a_headless_service,
    tm.test_actor_replicas_are_the_scale_knob,
    tm.test_learner_gpu_request,
    tm.test_resources_have_requests_within_limits,
    tm.test_config_map_parses_for_every_service,
    tm.test_replay_tables_are_the_algorithms,
    tm.test_network_policies_deny_by_default_both_ways,
    tm.test_ingress_admits_the_service_flows_and_scrapes_from_monitoring_only,
    tm.test_egress_is_dns_and_the_service_flows_only,
]
REPLACED = {
    "test_every_manifest_validates_strictly": "test_overlay_validates_strictly",
    "test_probes_target_container_ports": "test_no_grpc_probe_is_left_on_a_tls_port",
    "test_every_pod_runs_unprivileged": "test_pods_stay_unprivileged_with_read_only_secrets",
}


def overlay_docs() -> list[dict]:
    return tm.bundle_docs(OVERLAY)  # parsed anew each call: callers may change them


@pytest.fixture
def bundle() -> tuple[str, list[dict]]:
    return OVERLAY, overlay_docs()


def tls_settings(docs, tmp_path, monkeypatch) -> dict[str, dict[str, str]]:
    """Service -> its TLS settings, as `apexrl <service>` parses the rendered pod."""
    settings = {}
    for name in tm.SERVICES:
        config = tm.effective_config(docs, name, tmp_path, monkeypatch)
        fields = {f.name for f in dataclasses.fields(config)} & (
            SERVER_TLS | CLIENT_TLS | METRICS_TLS
        )
        settings[name] = {field: getattr(config, field) for field in fields}
    return settings


def secret_file(workload: dict, path: str) -> tuple[str, str]:
    """(Secret name, key) of the file at `path` in the pod, or the test fails."""
    name = workload["metadata"]["name"]
    volumes = {v["name"]: v for v in tm.pod_spec(workload)["volumes"]}
    volumes |= {n: {} for n in tm.claim_templates(workload)}
    for mount in tm.container(workload)["volumeMounts"]:
        target = PurePosixPath(path)
        if not target.is_relative_to(mount["mountPath"]):
            continue
        secret = volumes[mount["name"]].get("secret")
        assert secret, f"{name}: {path} is on volume {mount['name']}, not a Secret"
        assert mount.get("readOnly") is True, f"{name}: {mount['mountPath']} is read-only"
        relative = str(target.relative_to(mount["mountPath"]))
        # items make a missing key an error the pod reports, not a file the process misses.
        items = {item["path"]: item["key"] for item in secret.get("items", [])}
        assert relative in items, f"{name}: {path}: no item of Secret {secret['secretName']}"
        return secret["secretName"], items[relative]
    pytest.fail(f"{name}: no volume is mounted at {path}")


# --- the generic checks --------------------------------------------------------------------


def test_the_generic_checks_are_all_run_or_replaced():
    """A check added to test_manifests.py must be added here too (or replaced)."""
    bundle_checks = {
        name
        for name, check in vars(tm).items()
        if name.startswith("test_") and "bundle" in inspect.signature(check).parameters
    }
    assert bundle_checks == {check.__name__ for check in GENERIC} | set(REPLACED)
    assert all(name in globals() for name in REPLACED.values())


@pytest.mark.parametrize("check", GENERIC, ids=lambda check: check.__name__[len("test_") :])
def test_generic_check(check, bundle, tmp_path, monkeypatch):
    fixtures = {"bundle": bundle, "tmp_path": tmp_path, "monkeypatch": monkeypatch}
    check(**{name: fixtures[name] for name in inspect.signature(check).parameters})


@pytest.mark.parametrize("version", tm.K8S_VERSIONS)
def test_overlay_validates_strictly(bundle, version):
    tm.test_every_manifest_validates_strictly(bundle, version)


def test_pods_stay_unprivileged_with_read_only_secrets(bundle):
    """The generic check, once the Secret volumes (read-only, each pod its own) are set aside."""
    name, docs = bundle
    secrets = set()
    for workload_name, workload in tm.workloads(docs).items():
        spec, box = tm.pod_spec(workload), tm.container(workload)
        secret_volumes = {v["name"]: v["secret"] for v in spec["volumes"] if "secret" in v}
        assert len(secret_volumes) == 1, workload_name
        for mount in box["volumeMounts"]:
            if mount["name"] in secret_volumes:
                assert mount.get("readOnly") is True, workload_name
                assert not mount.get("subPath"), f"{workload_name}: subPath never updates"
        secrets |= {v["secretName"] for v in secret_volumes.values()}
        spec["volumes"] = [v for v in spec["volumes"] if v["name"] not in secret_volumes]
        box["volumeMounts"] = [m for m in box["volumeMounts"] if m["name"] not in secret_volumes]
    assert len(secrets) == len(tm.SERVICES), "each pod mounts its own Secret"
    tm.test_every_pod_runs_unprivileged((name, docs))


def test_no_grpc_probe_is_left_on_a_tls_port():
    """Kubelet gRPC probes speak plaintext: TCP probes with the base's timing replace them."""
    base = tm.workloads(tm.bundle_docs("base"))
    for name, workload in tm.workloads(overlay_docs()).items():
        box, ports = tm.container(workload), tm.container_ports(workload)
        base_box = tm.container(base[name])
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            probe, base_probe = box.get(kind), copy.deepcopy(base_box.get(kind))
            assert (probe is None) == (base_probe is None), f"{name} {kind}"
            if probe is None:
                continue
            assert "grpc" not in probe, f"{name} {kind}"
            if name in tm.GRPC_SERVERS:
                assert probe["tcpSocket"]["port"] in ("grpc", ports["grpc"]), f"{name} {kind}"
                assert base_probe.pop("grpc")["port"] == ports["grpc"]
                base_probe["tcpSocket"] = probe["tcpSocket"]
            else:  # /metrics speaks TLS only: the kubelet's HTTPS probe skips verification
                assert probe["httpGet"]["scheme"] == "HTTPS", f"{name} {kind}"
                base_probe["httpGet"]["scheme"] = "HTTPS"
            assert probe == base_probe, f"{name} {kind}: only the mechanism changes"


# --- what the overlay adds -----------------------------------------------------------------


def test_servers_require_and_clients_present_certificates(tmp_path, monkeypatch):
    settings = tls_settings(overlay_docs(), tmp_path, monkeypatch)
    for name, values in settings.items():
        expected = (SERVER_TLS if name in tm.GRPC_SERVERS else set()) | (
            CLIENT_TLS if name in CLIENTS else set()
        )
        expected |= METRICS_TLS
        assert set(values) == expected, f"{name}: apexrl.config's TLS settings changed"
        unset = sorted(field for field, value in values.items() if not value)
        assert not unset, f"{name}: {unset} not set: a hop without (mutual) TLS"


def test_every_tls_file_is_a_key_of_the_pods_own_secret(tmp_path, monkeypatch):
    docs = overlay_docs()
    settings = tls_settings(docs, tmp_path, monkeypatch)
    workloads = tm.workloads(docs)
    for name, values in settings.items():
        for field, path in values.items():
            secret, key = secret_file(workloads[name], path)
            assert secret == f"{name}-tls", f"{name}: {field}"
            assert key == SECRET_KEY[field], f"{name}: {field} names Secret key {key}"


def test_readme_documents_the_secrets():
    text = README.read_text()
    docs = overlay_docs()
    for workload in tm.workloads(docs).values():
        for volume in tm.pod_spec(workload)["volumes"]:
            if "secret" in volume:
                assert f"`{volume['secret']['secretName']}`" in text
                assert {item["key"] for item in volume["secret"]["items"]} == set(
                    SECRET_KEY.values()
                )
    assert "ca.key" in text and "BEGIN" not in text, "no key material in the repository"
    # A StatefulSet's pods have names of their own under its headless Service: certificates
    # for them, should a client dial one shard by its pod name.
    for service in tm.of_kind(docs, "Service"):
        if service["spec"].get("clusterIP") == "None":
            name = service["metadata"]["name"]
            assert f"*.{name}.{tm.NAMESPACE}.svc" in text, f"{name}'s pod names"


# --- a real replay with the rendered settings ----------------------------------------------


def _issue(common_name: str, dns_names: list[str], ca=None):
    """Key and certificate: a CA (ca None), else signed by ca=(key, cert) as the README says."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject if ca is None else ca[1].subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca is None, path_length=None), critical=True)
    )
    if ca is not None:
        usages = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        names = [x509.DNSName(name) for name in dns_names]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return key, builder.sign(key if ca is None else ca[0], hashes.SHA256())


def _pem(key, cert) -> dict[str, bytes]:
    encoding = serialization.Encoding.PEM
    return {
        "tls.crt": cert.public_bytes(encoding),
        "tls.key": key.private_bytes(
            encoding, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
    }


def make_secrets(directory: Path, hosts: dict[str, str], headless: set[str]) -> None:
    """directory/<service>-tls/{tls.crt,tls.key,ca.crt}: the README's Secrets, one CA, each
    certificate for its Service name (hosts: service -> the host name its clients dial) and,
    for a headless Service's pods (replay-N.replay...), the wildcard under it."""
    ca = _issue("apexrl test CA", [])
    ca_pem = ca[1].public_bytes(serialization.Encoding.PEM)
    for service in tm.SERVICES:
        host = hosts.get(service, service)
        names = [host, f"{host}.{tm.NAMESPACE}", f"{host}.{tm.NAMESPACE}.svc"]
        if service in headless:  # TLS wildcards need two labels after them: not *.replay
            names += [f"*.{name}" for name in names[1:]]
        files = {**_pem(*_issue(service, names, ca)), "ca.crt": ca_pem}
        folder = directory / f"{service}-tls"
        folder.mkdir()
        for key, data in files.items():
            (folder / key).write_bytes(data)


def test_a_replay_serves_the_rendered_settings(tmp_path, monkeypatch):
    """`apexrl replay` with the replay pod's TLS variables, and a client with the learner's
    settings that checks the certificate against the host name the learner dials: the
    headless Service's name (every shard), or one shard's pod name."""
    docs = overlay_docs()
    workloads = tm.workloads(docs)
    learner = tm.effective_config(docs, "learner", tmp_path, monkeypatch)
    replay_host, replay_port, every_address = tm.peer(learner.replay)
    assert every_address, learner.replay
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    headless = {s["metadata"]["name"] for s in tm.of_kind(docs, "Service")
                if s["spec"].get("clusterIP") == "None"}  # fmt: skip
    make_secrets(secrets, {"replay": replay_host}, headless)

    def local(workload: dict, path: str) -> str:
        secret, key = secret_file(workload, path)
        return str(secrets / secret / key)

    for key in [k for k in os.environ if k.startswith("APEXRL_")]:
        monkeypatch.delenv(key)
    replay_env = tm.container(workloads["replay"])["env"]
    assert {e["name"] for e in replay_env} == {cfg.env_name(f) for f in SERVER_TLS | METRICS_TLS}
    for env in replay_env:
        monkeypatch.setenv(env["name"], local(workloads["replay"], env["value"]))
    replay = start_service(tmp_path, "replay", "--min-size-to-sample", "1")
    try:
        port = replay.ports["port"]
        address = f"127.0.0.1:{port}"
        # What the kubelet's TCP probe does: connect and hang up.
        socket.create_connection(("127.0.0.1", port), timeout=5).close()

        def info(ca: str, cert: str = "", key: str = "", host: str = replay_host):
            tls = cfg.ClientTLSConfig(tls_ca=ca, tls_client_cert=cert, tls_client_key=key)
            options = [("grpc.ssl_target_name_override", host)]
            with grpc.secure_channel(address, channel_credentials(tls), options) as channel:
                stub = replay_pb2_grpc.ReplayStub(channel)
                try:
                    return stub.Info(replay_pb2.InfoRequest(), timeout=10)
                except grpc.RpcError as err:
                    return err.code()

        settings = {
            field: local(workloads["learner"], getattr(learner, field)) for field in CLIENT_TLS
        }
        ca, cert, key = (settings[f] for f in ("tls_ca", "tls_client_cert", "tls_client_key"))
        served = info(ca, cert, key)
        assert isinstance(served, replay_pb2.InfoResponse), served
        assert [table.name for table in served.tables] == ["default"]
        pod = f"replay-0.{replay_host}.{tm.NAMESPACE}.svc"
        assert isinstance(info(ca, cert, key, pod), replay_pb2.InfoResponse), pod
        assert info(ca) == grpc.StatusCode.UNAVAILABLE, "a client without a certificate"
        assert info(ca, cert, key, "elsewhere") == grpc.StatusCode.UNAVAILABLE, "wrong name"
        with grpc.insecure_channel(address) as channel:
            with pytest.raises(grpc.RpcError):
                replay_pb2_grpc.ReplayStub(channel).Info(replay_pb2.InfoRequest(), timeout=5)

        # /metrics speaks TLS only, with the pod's certificate: a plaintext scrape gets nothing.
        metrics_url = f"127.0.0.1:{replay.metrics_port}/metrics"
        with pytest.raises((OSError, http.client.HTTPException)):
            urllib.request.urlopen(f"http://{metrics_url}", timeout=5).read()
        trusted = ssl.create_default_context(cafile=ca)
        trusted.check_hostname = False  # scraped by pod address, as Prometheus does
        with urllib.request.urlopen(f"https://{metrics_url}", timeout=5, context=trusted) as got:
            assert b"apexrl_replay_size" in got.read()

        # The learner's own client, its replay setting as rendered (dns:///replay:50051, the
        # port here the test replay's) with the name resolving to it: it dials each address
        # the name resolves to and must check each shard's certificate against that name,
        # which the certificate holds (not against the pod's address, which none can hold).
        resolve = socket.getaddrinfo

        def fake_dns(host, *args, **kwargs):
            return resolve("127.0.0.1" if host == replay_host else host, *args, **kwargs)

        monkeypatch.setattr(socket, "getaddrinfo", fake_dns)
        tls = cfg.ClientTLSConfig(tls_ca=ca, tls_client_cert=cert, tls_client_key=key)
        setting = learner.replay.replace(f":{replay_port}", f":{port}")
        client = sharded.connect(setting, tls=tls, timeout=10, retry_seconds=10)
        try:
            table = client.info()
        except grpc.RpcError as err:
            pytest.fail(f"the learner's client cannot reach the TLS shard: {err}")
        finally:
            client.close()
        assert table.name == "default"
    finally:
        replay.stop()
