"""What deploy/ promises, checked without a cluster, a container engine or the network.

Every manifest in deploy/k8s and every kustomize rendering validates against the Kubernetes
OpenAPI schemas in strict mode; then what schemas cannot see: selectors, ports and probes
that meet, settings the code really reads (parsed with apexrl.config itself), images,
security, NetworkPolicy flows, the Prometheus Operator extras and the Dockerfile.
"""

import dataclasses
import functools
import json
import math
import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from apexrl import algorithms, cli
from apexrl import config as cfg
from apexrl.algorithms.tables import PrioritizedTable
from apexrl.replay import keys

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
K8S = DEPLOY / "k8s"
KUSTOMIZE = DEPLOY / "kustomize"
NAMESPACE = "apexrl"
CONFIG_MAP, CONFIG_KEY = "apexrl-config", "apexrl.toml"
UID = 10001
# The oldest Kubernetes the manifests promise (native gRPC probes are GA there) and CI's.
K8S_VERSIONS = ["1.27.0", "1.32.0"]

SERVICES = {
    "replay": cfg.ReplayConfig,
    "learner": cfg.LearnerConfig,
    "relay": cfg.RelayConfig,
    "actor": cfg.ActorConfig,
    "evaluator": cfg.EvaluatorConfig,
}
GRPC_SERVERS = {"replay", "learner", "relay"}
# Servers whose state outlives a pod (checkpoints on a volume); the relay holds none.
DURABLE = {"replay", "learner"}
# Config tables a file may leave out: the relay's settings are its ports and peer (flags, env).
OPTIONAL_TABLES = {"relay"}
WORKLOAD_KINDS = {"Deployment", "StatefulSet"}
# A peer address setting -> the server it names.
PEERS = {"replay": "replay", "learner": "learner", "parameters": "relay"}
# Replay runs as shards: a StatefulSet behind a headless Service, dialled as every address
# of that name (apexrl.replay.shards); the other services are Deployments.
KIND = {name: "StatefulSet" if name == "replay" else "Deployment" for name in SERVICES}
DNS_SCHEME = "dns:///"
REPLAY_SHARDS = {"overlays/large": 4, "overlays/apex": 4}  # the others: 1
# Every overlay folder, found on disk: one added is rendered, validated and its ConfigMap
# parsed by every service here without being listed.
OVERLAYS = sorted(
    p.parent.relative_to(KUSTOMIZE).as_posix()
    for p in KUSTOMIZE.glob("overlays/*/kustomization.yaml")
)
# Checked by tests/deploy/test_tls_overlay.py (its probes speak TCP), with the generic checks.
OTHER_BUNDLES = ["overlays/mtls"]
BUNDLES = ["k8s", "base"] + [o for o in OVERLAYS if o not in OTHER_BUNDLES]
# Registered algorithms without an overlay yet: each is being added as its own overlay
# folder (deploy/kustomize/overlays/<name>). Keep this list short; an algorithm leaves it
# when its overlay lands.
WITHOUT_OVERLAY_YET: set[str] = set()
# Metrics the alerts may use besides apexrl's own (kubelet cAdvisor and kube-state-metrics).
KUBERNETES_METRICS: set[str] = set()  # every alert reads apexrl's own metrics


# --- loading -------------------------------------------------------------------------------


def load_yaml(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def plain_manifests() -> list[dict]:
    return [doc for path in sorted(K8S.glob("*.yaml")) for doc in load_yaml(path)]


@functools.cache
def _rendered(overlay: str) -> str:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.fail(
            "kubectl is not installed: it renders deploy/kustomize (`kubectl kustomize`, "
            "kustomize v5 built in). Install kubectl >= 1.27 to run these tests."
        )
    result = subprocess.run(
        [kubectl, "kustomize", str(KUSTOMIZE / overlay)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if result.returncode != 0:
        pytest.fail(f"kubectl kustomize {overlay} failed:\n{result.stderr}")
    return result.stdout


def bundle_docs(bundle: str) -> list[dict]:
    if bundle == "k8s":
        return plain_manifests()
    return [doc for doc in yaml.safe_load_all(_rendered(bundle)) if doc is not None]


@pytest.fixture(params=BUNDLES)
def bundle(request) -> tuple[str, list[dict]]:
    return request.param, bundle_docs(request.param)


def of_kind(docs: list[dict], kind: str) -> list[dict]:
    return [doc for doc in docs if doc["kind"] == kind]


def named(docs: list[dict], kind: str, name: str) -> dict:
    found = [doc for doc in of_kind(docs, kind) if doc["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def workloads(docs: list[dict]) -> dict[str, dict]:
    """Service name -> its Deployment (learner, actor, evaluator) or StatefulSet (replay)."""
    return {doc["metadata"]["name"]: doc for doc in docs if doc["kind"] in WORKLOAD_KINDS}


def claim_templates(workload: dict) -> dict[str, dict]:
    """A StatefulSet's volumeClaimTemplates by name (each pod mounts its own claim of each)."""
    return {t["metadata"]["name"]: t for t in workload["spec"].get("volumeClaimTemplates", [])}


def peer(address: str) -> tuple[str, int, bool]:
    """(host, port, every address of the name is a peer) of a client's address setting."""
    resolve_all = address.startswith(DNS_SCHEME)
    host, _, port = address.removeprefix(DNS_SCHEME).rpartition(":")
    return host, int(port), resolve_all


def pod_spec(workload: dict) -> dict:
    return workload["spec"]["template"]["spec"]


def pod_labels(workload: dict) -> dict:
    return workload["spec"]["template"]["metadata"]["labels"]


def container(workload: dict) -> dict:
    containers = pod_spec(workload)["containers"]
    assert len(containers) == 1, f"{workload['metadata']['name']}: one container per pod"
    return containers[0]


def container_ports(workload: dict) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in container(workload).get("ports", [])}


def selects(selector: dict, labels: dict) -> bool:
    """A LabelSelector (matchLabels, matchExpressions) applied to a pod's labels."""
    for key, value in selector.get("matchLabels", {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions", []):
        op, key, values = expr["operator"], expr["key"], expr.get("values", [])
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and labels.get(key) in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def config_toml(docs: list[dict]) -> str:
    return named(docs, "ConfigMap", CONFIG_MAP)["data"][CONFIG_KEY]


def replay_table(data: dict, table: str = "default") -> dict:
    """The [[replay.tables]] entry named `table` of a parsed ConfigMap file."""
    (entry,) = [t for t in data["replay"]["tables"] if t["name"] == table]
    return entry


def effective_config(docs: list[dict], name: str, tmp_path: Path, monkeypatch):
    """The settings `apexrl <name>` would run with in this pod, parsed by apexrl.config."""
    workload = workloads(docs)[name]
    spec, box = pod_spec(workload), container(workload)
    # --config must point at the ConfigMap's file where the pod mounts it.
    mounts = {m["name"]: m["mountPath"] for m in box.get("volumeMounts", [])}
    config_volumes = [
        v["name"]
        for v in spec.get("volumes", [])
        if v.get("configMap", {}).get("name") == CONFIG_MAP
    ]
    assert len(config_volumes) == 1, f"{name}: mounts the ConfigMap {CONFIG_MAP} once"
    mounted_at = f"{mounts[config_volumes[0]]}/{CONFIG_KEY}"
    config_file = tmp_path / f"{name}.toml"
    config_file.write_text(config_toml(docs))
    args = list(box.get("args", []))
    assert f"--config={mounted_at}" in args, f"{name}: args pass --config={mounted_at}"
    args = [f"--config={config_file}" if a == f"--config={mounted_at}" else a for a in args]
    for key in [k for k in os.environ if k.startswith("APEXRL_")]:
        monkeypatch.delenv(key)
    for env in box.get("env", []):
        assert "value" in env, f"{name}: env {env['name']} is a literal value"
        monkeypatch.setenv(env["name"], env["value"])
    try:
        return cfg.parse(SERVICES[name], args, name, f"apexrl {name}", algorithms.REGISTRY)
    except SystemExit:
        pytest.fail(f"apexrl {name} rejects the manifest's args {args} (see stderr)")


# --- schemas and layout --------------------------------------------------------------------


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_manifest_validates_strictly(bundle, version):
    name, docs = bundle
    assert docs, f"{name}: no manifests"
    for doc in docs:
        what = f"{name}: {doc.get('kind')} {doc.get('metadata', {}).get('name')}"
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            path = ".".join(str(p) for p in err.path)
            pytest.fail(f"{what} is invalid for Kubernetes {version}: {path}: {err.message}")
        except kubernetes_validate.SchemaNotFoundError:
            pytest.fail(f"{what}: not a built-in kind (deploy/k8s must apply without CRDs)")


def test_every_resource_is_in_the_namespace(bundle):
    name, docs = bundle
    assert [d["metadata"]["name"] for d in of_kind(docs, "Namespace")] == [NAMESPACE]
    for doc in docs:
        if doc["kind"] != "Namespace":
            assert doc["metadata"].get("namespace") == NAMESPACE, f"{name}: {doc['kind']}"


def test_namespace_comes_first_for_kubectl_apply():
    files = sorted(K8S.glob("*.yaml"))
    assert [d["kind"] for d in load_yaml(files[0])] == ["Namespace"]


def test_kustomization_lists_every_plain_manifest():
    """deploy/k8s/Kustomization (no .yaml: `kubectl apply -f` skips it) lists what -f applies."""
    kustomization = yaml.safe_load((K8S / "Kustomization").read_text())
    assert sorted(kustomization["resources"]) == sorted(p.name for p in K8S.glob("*.yaml"))
    assert not list(K8S.glob("*.yml")) and not list(K8S.glob("*.json"))


def test_base_renders_the_plain_manifests():
    def identity(doc: dict) -> tuple[str, str]:
        return doc["kind"], doc["metadata"]["name"]

    assert sorted(bundle_docs("base"), key=identity) == sorted(plain_manifests(), key=identity)


def test_one_file_per_service_with_what_it_needs():
    for name in SERVICES:
        kinds = {d["kind"] for d in load_yaml(K8S / f"{name}.yaml")}
        assert {KIND[name], "ServiceAccount"} <= kinds, name
        assert not kinds & WORKLOAD_KINDS - {KIND[name]}, name
        if name in GRPC_SERVERS:
            assert "Service" in kinds, name
    # The learner's checkpoint claim is an object; each replay shard's comes from its template.
    assert "PersistentVolumeClaim" in {d["kind"] for d in load_yaml(K8S / "learner.yaml")}
    assert "PersistentVolumeClaim" not in {d["kind"] for d in load_yaml(K8S / "replay.yaml")}


def test_every_overlay_is_checked():
    assert {"overlays/impala", "overlays/ppo", "overlays/dpg", "overlays/mtls"} <= set(OVERLAYS)
    checked = [b for b in BUNDLES + OTHER_BUNDLES if b.startswith("overlays/")]
    assert sorted(checked) == OVERLAYS
    for overlay in OVERLAYS:
        assert bundle_docs(overlay), f"{overlay} renders nothing"


def test_every_registered_algorithm_has_an_overlay():
    """Each algorithm of the registry runs on Kubernetes from a ready overlay (the base runs
    dqn), but for the few named in WITHOUT_OVERLAY_YET."""
    deployed: dict[str, str] = {}
    for bundle in ["base", *OVERLAYS]:
        data = tomllib.loads(config_toml(bundle_docs(bundle)))
        deployed.setdefault(data["algorithm"], bundle)
    missing = set(algorithms.ALGORITHMS) - set(deployed) - WITHOUT_OVERLAY_YET
    assert not missing, (
        f"registered algorithms without an overlay: {sorted(missing)}; add "
        "deploy/kustomize/overlays/<name> (an apexrl.toml with algorithm = <name>)"
    )
    assert len(WITHOUT_OVERLAY_YET) <= 2, "the list of algorithms without an overlay grows"


# --- wiring --------------------------------------------------------------------------------


def test_workload_selectors_match_pod_labels(bundle):
    name, docs = bundle
    assert set(workloads(docs)) == set(SERVICES), name
    for workload_name, workload in workloads(docs).items():
        assert workload["kind"] == KIND[workload_name], f"{name}: {workload_name}"
        selector = workload["spec"]["selector"]
        assert not selector.get("matchExpressions"), workload_name
        assert selector["matchLabels"], workload_name
        assert selects(selector, pod_labels(workload)), workload_name
        assert pod_labels(workload)["app.kubernetes.io/name"] == workload_name
        assert container(workload)["name"] == workload_name
        others = [d for n, d in workloads(docs).items() if n != workload_name]
        assert not any(selects(selector, pod_labels(d)) for d in others), workload_name


def test_services_select_one_workload_and_target_its_ports(bundle):
    name, docs = bundle
    services = {s["metadata"]["name"]: s for s in of_kind(docs, "Service")}
    assert set(services) == GRPC_SERVERS, name
    for service_name, service in services.items():
        matched = [
            d
            for d in workloads(docs).values()
            if all(pod_labels(d).get(k) == v for k, v in service["spec"]["selector"].items())
        ]
        assert [d["metadata"]["name"] for d in matched] == [service_name]
        ports = container_ports(matched[0])
        for port in service["spec"]["ports"]:
            target = port["targetPort"]
            assert target in ports or target in ports.values(), f"{service_name}: {target}"
            number = ports[target] if isinstance(target, str) else target
            assert port["port"] == number, f"{service_name}: port {port['name']}"
            assert port["name"] in ports, f"{service_name}: port name {port['name']}"
        assert {p["name"] for p in service["spec"]["ports"]} == {"grpc", "metrics"}


def test_probes_target_container_ports(bundle):
    name, docs = bundle
    for workload_name, workload in workloads(docs).items():
        box, ports = container(workload), container_ports(workload)
        expected_ports = {"grpc", "metrics"} if workload_name in GRPC_SERVERS else {"metrics"}
        assert set(ports) == expected_ports, workload_name
        assert box.get("readinessProbe") and box.get("livenessProbe"), workload_name
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            probe = box.get(kind)
            if probe is None:
                continue
            where = f"{name}: {workload_name} {kind}"
            if workload_name in GRPC_SERVERS:
                # Native gRPC probe on the standard health service (overall status: service "").
                assert set(probe) & {"grpc", "httpGet", "tcpSocket", "exec"} == {"grpc"}, where
                assert probe["grpc"]["port"] == ports["grpc"], where
                assert probe["grpc"].get("service", "") == "", where
            else:
                assert set(probe) & {"grpc", "httpGet", "tcpSocket", "exec"} == {"httpGet"}
                assert probe["httpGet"]["path"] == "/metrics", where
                assert probe["httpGet"]["port"] in ("metrics", ports["metrics"]), where


def test_ports_and_paths_match_what_the_code_reads(bundle, tmp_path, monkeypatch):
    name, docs = bundle
    services = {s["metadata"]["name"]: s for s in of_kind(docs, "Service")}
    claims = {c["metadata"]["name"] for c in of_kind(docs, "PersistentVolumeClaim")}
    for workload_name, workload in workloads(docs).items():
        config = effective_config(docs, workload_name, tmp_path, monkeypatch)
        ports, spec = container_ports(workload), pod_spec(workload)
        where = f"{name}: {workload_name}"
        assert config.host == "0.0.0.0", where
        assert config.metrics_port == ports["metrics"], where
        annotations = workload["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true", where
        assert annotations["prometheus.io/port"] == str(config.metrics_port), where
        assert annotations["prometheus.io/path"] == "/metrics", where
        if workload_name in GRPC_SERVERS:
            assert config.port == ports["grpc"], where
        if workload_name in DURABLE:
            # The checkpoints go to the mounted volume, and SIGTERM leaves time to write them.
            mounts = {m["mountPath"]: m["name"] for m in container(workload)["volumeMounts"]}
            volume_name = mounts[config.checkpoint_dir]
            if workload["kind"] == "StatefulSet":  # a claim per shard, from the template
                assert volume_name in claim_templates(workload), where
            else:
                volume = {v["name"]: v for v in spec["volumes"]}[volume_name]
                assert volume["persistentVolumeClaim"]["claimName"] in claims, where
            assert spec["terminationGracePeriodSeconds"] >= config.grace_seconds + 30, where
        # Peer addresses are Service DNS names and ports that lead to that peer's gRPC port;
        # replay's is every address of its headless Service (dns:///), one per shard; an
        # actor's `parameters` are the relays'.
        for setting, server in PEERS.items():
            address = getattr(config, setting, None)
            if address is None or not isinstance(address, str):
                continue
            host, port, resolve_all = peer(address)
            assert host in (server, f"{server}.{NAMESPACE}", f"{server}.{NAMESPACE}.svc"), where
            service_ports = {p["port"]: p for p in services[server]["spec"]["ports"]}
            assert service_ports[port]["targetPort"] == "grpc", where
            headless = services[server]["spec"].get("clusterIP") == "None"
            assert resolve_all == headless == (server == "replay"), f"{where}: {address}"


def test_every_flag_and_env_var_is_a_setting_of_the_service(bundle):
    name, docs = bundle
    for workload_name, workload in workloads(docs).items():
        box, cls = container(workload), SERVICES[workload_name]
        fields = {f.name for f in dataclasses.fields(cls)}
        assert "command" not in box, f"{workload_name}: the image's entrypoint runs apexrl"
        flags = {"--config"} | {"--" + f.replace("_", "-") for f in fields}
        for arg in box.get("args", []):
            assert arg.startswith("--") and "=" in arg, f"{workload_name}: write --flag=value"
            assert arg.split("=", 1)[0] in flags, f"{workload_name}: unknown flag {arg}"
        env_names = {"APEXRL_CONFIG"} | {cfg.env_name(f) for f in fields}
        for env in box.get("env", []):
            assert env["name"] in env_names, f"{workload_name}: unknown env {env['name']}"


def test_images_are_named_consistently(bundle):
    name, docs = bundle
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    suffix = {"learner": "-cpu"} if name == "overlays/cpu-only" else {}
    for workload_name, workload in workloads(docs).items():
        expected = f"apexrl/{workload_name}:{version}{suffix.get(workload_name, '')}"
        assert container(workload)["image"] == expected, name
        assert container(workload)["imagePullPolicy"] == "IfNotPresent", name


# --- workload shape ------------------------------------------------------------------------


def test_learner_is_one_replica_replaced_whole(bundle):
    name, docs = bundle
    spec = workloads(docs)["learner"]["spec"]
    assert spec["replicas"] == 1 and spec["strategy"] == {"type": "Recreate"}, name


def test_replay_is_a_statefulset_of_shards_behind_a_headless_service(bundle):
    """Pod replay-N is shard N (its host name), keeps its own checkpoint claim when scaled
    down, and `replay` resolves to every ready shard."""
    name, docs = bundle
    replay = workloads(docs)["replay"]
    spec, box = replay["spec"], container(replay)
    assert replay["kind"] == "StatefulSet", name
    assert spec["replicas"] == REPLAY_SHARDS.get(name, 1), name
    assert spec["podManagementPolicy"] == "Parallel", name
    assert spec.get("updateStrategy", {}).get("type", "RollingUpdate") == "RollingUpdate"
    assert spec["persistentVolumeClaimRetentionPolicy"] == {
        "whenScaled": "Retain",
        "whenDeleted": "Retain",
    }, name
    # One claim per shard, mounted where the checkpoints go, and no shared volume of that name.
    (template,) = claim_templates(replay).values()
    assert template["spec"]["accessModes"] == ["ReadWriteOnce"], name
    assert quantity(template["spec"]["resources"]["requests"]["storage"]) > 0, name
    assert template["metadata"]["labels"] == pod_labels(replay), name
    mounts = {m["name"]: m["mountPath"] for m in box["volumeMounts"]}
    assert template["metadata"]["name"] not in {v["name"] for v in pod_spec(replay)["volumes"]}
    assert mounts[template["metadata"]["name"]] == "/var/lib/apexrl/replay", name
    assert not [c for c in of_kind(docs, "PersistentVolumeClaim")
                if c["metadata"]["labels"]["app.kubernetes.io/name"] == "replay"], name  # fmt: skip
    # Its Service is the StatefulSet's governing one: headless, only ready shards resolve.
    service = named(docs, "Service", spec["serviceName"])
    assert service["metadata"]["name"] == "replay", name
    assert service["spec"]["clusterIP"] == "None", name
    assert service["spec"].get("publishNotReadyAddresses", False) is False, name
    assert selects({"matchLabels": service["spec"]["selector"]}, pod_labels(replay)), name
    # The shard id is the ordinal ending the pod's host name, as apexrl.replay parses it.
    assert "--shard=hostname" in box["args"], name
    for ordinal in range(spec["replicas"]):
        assert keys.parse_shard("hostname", f"replay-{ordinal}") == ordinal
        fqdn = f"replay-{ordinal}.replay.{NAMESPACE}.svc.cluster.local"
        assert keys.parse_shard("hostname", fqdn) == ordinal


def test_actor_replicas_are_the_scale_knob(bundle):
    name, docs = bundle
    actor = workloads(docs)["actor"]
    expected = {"overlays/large": 32, "overlays/atari": 16, "overlays/apex": 360}.get(name, 4)
    assert actor["spec"]["replicas"] == expected
    assert actor["spec"].get("strategy", {}).get("type", "RollingUpdate") == "RollingUpdate"


def test_learner_gpu_request(bundle):
    name, docs = bundle
    for workload_name, workload in workloads(docs).items():
        resources = container(workload)["resources"]
        gpus = [resources[k].get("nvidia.com/gpu") for k in ("requests", "limits")]
        if workload_name == "learner" and name != "overlays/cpu-only":
            assert gpus == [1, 1], name
        else:
            assert gpus == [None, None], f"{name}: {workload_name}"
            assert not pod_spec(workload).get("tolerations"), f"{name}: {workload_name}"


QUANTITY = re.compile(r"^([0-9.]+)(m|Ki|Mi|Gi|Ti|k|M|G|T)?$")
SCALE = {None: 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
SCALE |= {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def quantity(value) -> float:
    match = QUANTITY.match(str(value))
    assert match, f"not a quantity: {value!r}"
    return float(match[1]) * SCALE[match[2]]


def test_resources_have_requests_within_limits(bundle):
    name, docs = bundle
    for workload_name, workload in workloads(docs).items():
        resources = container(workload)["resources"]
        for resource in ("cpu", "memory"):
            request = quantity(resources["requests"][resource])
            limit = quantity(resources["limits"][resource])
            assert 0 < request <= limit, f"{name}: {workload_name} {resource}"


def test_large_overlay_gives_replay_more_memory_and_cpu_in_all():
    """Over its shards: each shard holds what the base's one replay holds."""

    def total(bundle: str, resource: str) -> float:
        replay = workloads(bundle_docs(bundle))["replay"]
        limits = container(replay)["resources"]["limits"]
        return replay["spec"]["replicas"] * quantity(limits[resource])

    for resource in ("memory", "cpu"):
        assert total("overlays/large", resource) > total("base", resource), resource


# --- security ------------------------------------------------------------------------------


def test_every_pod_runs_unprivileged(bundle):
    name, docs = bundle
    accounts = {a["metadata"]["name"]: a for a in of_kind(docs, "ServiceAccount")}
    for workload_name, workload in workloads(docs).items():
        spec, box = pod_spec(workload), container(workload)
        where = f"{name}: {workload_name}"
        assert spec["automountServiceAccountToken"] is False, where
        assert accounts[spec["serviceAccountName"]]["automountServiceAccountToken"] is False
        for host in ("hostNetwork", "hostPID", "hostIPC"):
            assert not spec.get(host), where
        pod_sc, sc = spec.get("securityContext", {}), box["securityContext"]
        effective = {**pod_sc, **sc}
        assert effective["runAsNonRoot"] is True, where
        assert effective["runAsUser"] == UID, where
        assert effective["seccompProfile"] == {"type": "RuntimeDefault"}, where
        assert sc["readOnlyRootFilesystem"] is True, where
        assert sc["allowPrivilegeEscalation"] is False, where
        assert sc.get("privileged", False) is False, where
        assert sc["capabilities"]["drop"] == ["ALL"] and not sc["capabilities"].get("add")
        # Writable paths are volumes: /tmp an emptyDir, checkpoints a PVC; config read-only.
        volumes = {v["name"]: v for v in spec["volumes"]}
        volumes |= {n: {"persistentVolumeClaim": t} for n, t in claim_templates(workload).items()}
        mounts = {m["mountPath"]: m for m in box["volumeMounts"]}
        assert "emptyDir" in volumes[mounts["/tmp"]["name"]], where
        for mount in mounts.values():
            volume = volumes[mount["name"]]
            if "configMap" in volume:
                assert mount.get("readOnly") is True, where
            else:
                assert {"emptyDir", "persistentVolumeClaim"} & set(volume), where


# --- configuration -------------------------------------------------------------------------


def parse_config_map(name: str, text: str, tmp_path: Path) -> dict:
    """Service -> the settings `apexrl <service> --config FILE` reads from the ConfigMap's file
    (with the algorithm registry, as apexrl.cli parses: the algorithm's table too)."""
    path = tmp_path / CONFIG_KEY
    path.write_text(text)
    configs = {}
    for section, cls in SERVICES.items():
        try:
            configs[section] = cfg.parse(
                cls, ["--config", str(path)], section, f"apexrl {section}", algorithms.REGISTRY
            )
        except SystemExit:
            pytest.fail(f"{name}: [{section}] of {CONFIG_KEY} is rejected (see stderr)")
    return configs


def test_config_map_parses_for_every_service(bundle, tmp_path):
    name, docs = bundle
    text = config_toml(docs)
    data = tomllib.loads(text)
    # A table per service and the algorithm's own (its settings: n_step, ...), nothing else.
    algorithm = algorithms.get(data["algorithm"]).name
    tables = {k for k, v in data.items() if isinstance(v, dict)}
    assert tables - OPTIONAL_TABLES == set(SERVICES) - OPTIONAL_TABLES | {algorithm}, name
    # parse() ignores top-level keys no service has (they are shared): catch typos here.
    known = {f.name for cls in SERVICES.values() for f in dataclasses.fields(cls)}
    unknown = {k for k, v in data.items() if not isinstance(v, dict)} - known
    assert not unknown, f"{name}: top-level keys no service reads: {unknown}"
    configs = parse_config_map(name, text, tmp_path)
    # The learner, actors and evaluator agree on the agent (only set at the top level) and on
    # the algorithm's settings (its table, read by each of them).
    agent = [f.name for f in dataclasses.fields(cfg.AgentConfig)]
    assert "algo" in agent
    for section in ("learner", "actor", "evaluator"):
        assert not set(data[section]) & set(agent), f"{name}: [{section}] sets agent keys"
        values = [getattr(configs[section], field) for field in agent]
        assert values == [getattr(configs["learner"], field) for field in agent]
    settings = configs["learner"].algo
    assert dataclasses.asdict(settings) == {
        **dataclasses.asdict(algorithms.get(algorithm).Settings()),
        **data[algorithm],
    }, f"{name}: [{algorithm}] is the learner's algo"


# What the learner checks of the replay's table (replay_checks.check_table), and the columns.
TABLE_DECLARED = ("name", "sampler", "remover", "max_times_sampled", "rate_limiter", "signature")


def test_replay_tables_are_the_algorithms(bundle, tmp_path):
    """The replay's [[replay.tables]] are the tables the algorithm's builder declares for the
    env (as `apexrl local` writes them), but for their sizes: the sampler, remover,
    max_times_sampled and rate limiter the learner checks at start, and the signature that
    refuses inserts of another algorithm or env. Flat table settings in [replay] would make
    a table the builder did not declare."""
    name, docs = bundle
    text = config_toml(docs)
    data = tomllib.loads(text)
    flat = {f.name for f in dataclasses.fields(cfg.ReplayTableConfig)} | {"table"}
    assert not flat & set(data["replay"]), f"{name}: table settings belong in [[replay.tables]]"
    assert data["replay"].get("tables"), f"{name}: [replay] declares no [[replay.tables]]"
    configs = parse_config_map(name, text, tmp_path)
    served = configs["replay"].table_configs()
    declared = algorithms.make(configs["learner"]).tables()

    def identity(tables: list[cfg.ReplayTableConfig]) -> list[dict]:
        return [{key: getattr(table, key) for key in TABLE_DECLARED} for table in tables]

    assert identity(served) == identity(declared), name
    # The actors and the evaluator build the same algorithm, so the same tables.
    for section in ("actor", "evaluator"):
        assert identity(algorithms.make(configs[section]).tables()) == identity(declared)


def test_dpg_overlay_switches_the_whole_stack_by_its_agent_settings():
    base = tomllib.loads(config_toml(bundle_docs("base")))
    dpg = tomllib.loads(config_toml(bundle_docs("overlays/dpg")))
    assert (dpg["algorithm"], dpg["env"]) == ("dpg", "Pendulum-v1")
    assert "action:float32:1:-2..2" in replay_table(dpg)["signature"]
    for table in ("replay", "learner", "actor", "evaluator"):  # the same keys, tuned values
        assert set(dpg[table]) == set(base[table]), table
    assert set(replay_table(dpg)) == set(replay_table(base))
    assert set(dpg["dpg"]) == set(base["dqn"]), "the algorithms' tables set the same keys"


def test_atari_overlay_runs_pong_from_compressed_frames_with_room_for_2m_transitions():
    atari = tomllib.loads(config_toml(bundle_docs("overlays/atari")))
    assert atari["env"].startswith("ALE/") and replay_table(atari)["capacity"] == 2_000_000
    assert replay_table(atari)["signature"].startswith("observations:uint8:2x4x84x84:zstd,")
    replay = workloads(bundle_docs("overlays/atari"))["replay"]
    resources = container(replay)["resources"]
    # benchmarks/atari.py: ~0.46 KB a stored Pong transition, ~1.9 KB MsPacman.
    assert quantity(resources["requests"]["memory"]) >= 2_000_000 * 0.46e3
    assert quantity(resources["limits"]["memory"]) >= 2_000_000 * 1.9e3
    # Two checkpoints of MsPacman-size frames fit each shard's claim.
    (template,) = claim_templates(replay).values()
    assert quantity(template["spec"]["resources"]["requests"]["storage"]) >= 2 * 2_000_000 * 1.9e3


def test_apex_overlay_is_sized_as_the_paper():
    """Ape-X DQN (Horgan et al. 2018): 360 actors of one env pulling every 400 steps, the
    learner on one GPU, 2M transitions over the shards, a relay per 64 actors at most; sized
    from docs/scaling.md's figures at Ape-X's 34.7 agent steps/s an actor."""
    docs = bundle_docs("overlays/apex")
    data, pods = tomllib.loads(config_toml(docs)), workloads(docs)
    actors, shards = pods["actor"]["spec"]["replicas"], pods["replay"]["spec"]["replicas"]
    relays = pods["relay"]["spec"]["replicas"]
    table = replay_table(data)
    assert (data["algorithm"], actors, data["actor"]["num_envs"]) == ("dqn", 360, 1)
    assert data["actor"]["pull_interval"] == 400 and data["learner"]["batch_size"] == 512
    assert container(pods["learner"])["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert shards * table["capacity"] == 2_000_000 and shards > 1
    assert relays == math.ceil(actors / 64)
    # A lease outlasts an actor's pull period at Ape-X's pace (400 / 34.7 = 11.5 s).
    assert data["learner"]["lease_seconds"] > 400 / 34.7
    # Each relay takes at most one version every 2 s from the learner.
    env = {e["name"]: e["value"] for e in container(pods["relay"])["env"]}
    assert float(env["APEXRL_MIN_PULL_SECONDS"]) == 2.0
    # Ape-X's ratio: 19 batches of 512 a second over 12.5K transitions, per shard.
    assert table["samples_per_insert"] == pytest.approx(19 * 512 / 12_500, abs=0.01)
    assert table["min_size_to_sample"] * shards == 50_000
    # A shard's memory holds its MsPacman-size transitions (1,854 B, docs/benchmarks.md), and
    # its claim two checkpoints of them.
    resources = container(pods["replay"])["resources"]
    assert quantity(resources["limits"]["memory"]) >= table["capacity"] * 1_854 * 2
    assert quantity(resources["requests"]["memory"]) >= table["capacity"] * 457 * 2
    (template,) = claim_templates(pods["replay"]).values()
    claim = quantity(template["spec"]["resources"]["requests"]["storage"])
    assert claim >= 2 * table["capacity"] * 1_854


def test_large_overlay_config_differs_only_in_replay():
    """Only the replay and its table's sizes (set in the algorithm's settings) differ."""
    base = tomllib.loads(config_toml(bundle_docs("base")))
    large = tomllib.loads(config_toml(bundle_docs("overlays/large")))
    sizes = {f.name for f in dataclasses.fields(PrioritizedTable)}

    def without_replay(data: dict) -> dict:
        algorithm = data["algorithm"]
        kept = {k: v for k, v in data.items() if k not in ("replay", algorithm)}
        return kept | {algorithm: {k: v for k, v in data[algorithm].items() if k not in sizes}}

    assert without_replay(large) == without_replay(base)
    assert set(large["replay"]) == set(base["replay"])
    assert set(replay_table(large)) == set(replay_table(base))
    # capacity is per shard: the toml says 4M in all over the overlay's shards.
    shards = workloads(bundle_docs("overlays/large"))["replay"]["spec"]["replicas"]
    assert shards == REPLAY_SHARDS["overlays/large"]
    assert shards * replay_table(large)["capacity"] == 4_000_000 > replay_table(base)["capacity"]


# --- network policies ----------------------------------------------------------------------

MONITORING = "namespace monitoring"
CLUSTER_DNS = "kube-system k8s-app=kube-dns"


def policy_peers(peer: dict, pods: dict[str, dict], where: str) -> set[str]:
    """The apexrl workloads a NetworkPolicy peer selects, or one name for what lies outside the
    namespace: MONITORING (every pod of that namespace), CLUSTER_DNS."""
    assert "ipBlock" not in peer, f"{where}: peers are selected by labels, never by address"
    if "namespaceSelector" not in peer:
        return {n for n, labels in pods.items() if selects(peer["podSelector"], labels)}
    assert set(peer["namespaceSelector"]) == {"matchLabels"}, where
    (namespace,) = peer["namespaceSelector"]["matchLabels"].items()
    assert namespace[0] == "kubernetes.io/metadata.name", f"{where}: a namespace by its name"
    if namespace[1] == "monitoring":
        assert "podSelector" not in peer, where
        return {MONITORING}
    assert namespace[1] == "kube-system", where
    assert peer["podSelector"] == {"matchLabels": {"k8s-app": "kube-dns"}}, where
    return {CLUSTER_DNS}


def allowed_flows(docs: list[dict], direction: str) -> set[tuple[str, str, str]]:
    """(source, destination, port) that the NetworkPolicies let through in `direction`
    ("Ingress" or "Egress"); a port is a container port's name, or PROTOCOL/number outside
    the namespace."""
    pods = {name: pod_labels(d) for name, d in workloads(docs).items()}
    flows = set()
    rules_key, peers_key = ("ingress", "from") if direction == "Ingress" else ("egress", "to")
    for policy in of_kind(docs, "NetworkPolicy"):
        spec, where = policy["spec"], policy["metadata"]["name"]
        assert set(spec["policyTypes"]) <= {"Ingress", "Egress"}, where
        assert set(spec) - {"podSelector", "policyTypes"} <= {
            p.lower() for p in spec["policyTypes"]
        }
        if direction not in spec["policyTypes"]:
            continue
        selected = [n for n, labels in pods.items() if selects(spec["podSelector"], labels)]
        for rule in spec.get(rules_key, []):
            others = set().union(*(policy_peers(p, pods, where) for p in rule[peers_key]))
            for port in rule["ports"]:
                protocol = port.get("protocol", "TCP")
                for mine in selected:
                    for other in others:
                        server = mine if direction == "Ingress" else other
                        if server in pods:  # a named port of the pod that serves it
                            names = container_ports(workloads(docs)[server])
                            name = port["port"]
                            if not isinstance(name, str):
                                name = {v: k for k, v in names.items()}[name]
                            assert protocol == "TCP" and name in names, f"{where}: {server} {name}"
                        else:
                            name = f"{protocol}/{port['port']}"
                        pair = (other, mine) if direction == "Ingress" else (mine, other)
                        flows.add((*pair, name))
    return flows


APP_FLOWS = {
    ("actor", "replay", "grpc"),
    ("learner", "replay", "grpc"),
    ("actor", "learner", "grpc"),
    ("actor", "relay", "grpc"),
    ("relay", "learner", "grpc"),
    ("evaluator", "learner", "grpc"),
}


def test_network_policies_deny_by_default_both_ways(bundle):
    name, docs = bundle
    deny = named(docs, "NetworkPolicy", "default-deny")["spec"]
    assert deny == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}, name


def test_ingress_admits_the_service_flows_and_scrapes_from_monitoring_only(bundle):
    name, docs = bundle
    expected = APP_FLOWS | {(MONITORING, service, "metrics") for service in SERVICES}
    assert allowed_flows(docs, "Ingress") == expected, name


def test_egress_is_dns_and_the_service_flows_only(bundle):
    name, docs = bundle
    dns = {(s, CLUSTER_DNS, port) for s in SERVICES for port in ("UDP/53", "TCP/53")}
    assert allowed_flows(docs, "Egress") == APP_FLOWS | dns, name


# --- monitoring extras (Prometheus Operator, not applied by `kubectl apply -f deploy/k8s/`) -


def readme_metrics() -> set[str]:
    """Metric names in docs/metrics.md's metrics table.

    A row may abbreviate: `apexrl_learner_loss`, `_td_error_mean` shares a prefix with the
    row's first name, so `_suffix` entries count with every prefix of that name.
    """
    names = set()
    for line in (REPO / "docs" / "metrics.md").read_text().splitlines():
        if not line.startswith("| `"):
            continue
        first, *rest = re.findall(r"`([a-z_]+)`", line.split("|")[1])
        names.add(first)
        words = first.split("_")
        for cell in rest:
            if not cell.startswith("_"):
                names.add(cell)
                continue
            names |= {"_".join(words[:n]) + cell for n in range(2, len(words))}
    return names


def test_readme_metric_table_is_read():
    names = readme_metrics()
    assert {
        "apexrl_learner_updates_total",
        "apexrl_actor_transitions_inserted_total",
        "apexrl_actor_transitions_dropped_total",
        "apexrl_replay_samples_total",
        "apexrl_replay_checkpoint_size_bytes",
        "apexrl_actor_parameter_lag",
        "grpc_server_handling_seconds",
    } <= names


PROMQL_WORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring"}


def promql_metrics(expr: str) -> set[str]:
    """Metric names in a PromQL expression (no label names, functions or keywords)."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)
    expr = re.sub(r"\{[^}]*\}|\[[^\]]*\]", "", expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    names = set()
    for match in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr):
        following = expr[match.end() :].lstrip()
        if match[0] not in PROMQL_WORDS and not following.startswith("("):
            names.add(match[0])
    return names


def monitoring_docs() -> list[dict]:
    return [doc for p in sorted((K8S / "monitoring").glob("*.yaml")) for doc in load_yaml(p)]


def test_pod_monitors_scrape_every_service():
    docs, pods = monitoring_docs(), workloads(plain_manifests())
    monitors = of_kind(docs, "PodMonitor")
    assert all(m["apiVersion"] == "monitoring.coreos.com/v1" for m in monitors)
    covered = set()
    for monitor in monitors:
        assert monitor["metadata"]["namespace"] == NAMESPACE
        matched = [
            n for n, d in pods.items() if selects(monitor["spec"]["selector"], pod_labels(d))
        ]
        for endpoint in monitor["spec"]["podMetricsEndpoints"]:
            assert endpoint["path"] == "/metrics"
            assert all(endpoint["port"] in container_ports(pods[n]) for n in matched)
        covered |= set(matched)
    assert covered == set(SERVICES)


def prometheus_rules() -> dict:
    (rule,) = of_kind(monitoring_docs(), "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["namespace"] == NAMESPACE
    return {"groups": rule["spec"]["groups"]}


def test_alerts_watch_the_documented_metrics():
    alerts = {r["alert"]: r for g in prometheus_rules()["groups"] for r in g["rules"]}
    watched = {
        "ApexrlLearnerStalled": "apexrl_learner_updates_total",
        "ApexrlActorsNotInserting": "apexrl_actor_transitions_inserted_total",
        "ApexrlReplayNotSampling": "apexrl_replay_samples_total",
        "ApexrlReplayNearMemoryLimit": "process_resident_memory_bytes",
        "ApexrlParameterLagHigh": "apexrl_actor_parameter_lag",
        "ApexrlRelayNotPulling": "apexrl_relay_pull_failures_total",
        "ApexrlCheckpointFailing": "apexrl_learner_checkpoint_failures_total",
    }
    assert set(alerts) == set(watched)
    documented = readme_metrics()
    for alert, rule in alerts.items():
        metrics = promql_metrics(rule["expr"])
        assert watched[alert] in metrics, alert
        ours = {m for m in metrics if m.startswith(("apexrl_", "grpc_", "process_"))}
        assert ours <= documented, (
            f"{alert}: not in docs/metrics.md's metrics table: {ours - documented}"
        )
        assert metrics - ours <= KUBERNETES_METRICS, f"{alert}: unexpected {metrics - ours}"
        assert rule["labels"]["severity"] in ("warning", "critical"), alert
        assert rule["annotations"]["summary"], alert
        assert re.fullmatch(r"\d+[smh]", rule["for"]), alert


def test_replay_memory_alert_keeps_only_the_replay():
    """Every process exports its memory and limit; the alert keeps the targets that also export
    a replay-only metric."""
    (rule,) = [
        r
        for g in prometheus_rules()["groups"]
        for r in g["rules"]
        if r["alert"] == "ApexrlReplayNearMemoryLimit"
    ]
    assert "and on (instance) apexrl_replay_capacity" in " ".join(rule["expr"].split())
    replay_code = (DEPLOY.parent / "services" / "replay" / "metrics.py").read_text()
    assert '"capacity"' in replay_code and "apexrl_replay_{name}" in replay_code


def test_alert_rules_pass_promtool(tmp_path):
    promtool = shutil.which("promtool")
    assert promtool, "promtool is not installed: apt-get install prometheus (.ci/run does)"
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(prometheus_rules()))
    result = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_alert_rules_unit_tests_pass(tmp_path):
    """tests/deploy/rules-tests.yaml: each alert fires when it should and only then."""
    promtool = shutil.which("promtool")
    assert promtool, "promtool is not installed: apt-get install prometheus (.ci/run does)"
    (tmp_path / "apexrl-rules.yaml").write_text(yaml.safe_dump(prometheus_rules()))
    tests = tmp_path / "rules-tests.yaml"
    tests.write_text((Path(__file__).parent / "rules-tests.yaml").read_text())
    result = subprocess.run(
        [promtool, "test", "rules", str(tests)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    tested = set(re.findall(r"alertname: (\w+)", tests.read_text()))
    alerts = {r["alert"] for g in prometheus_rules()["groups"] for r in g["rules"] if "alert" in r}
    assert tested == alerts, f"alerts without a unit test: {alerts - tested}"


# --- images --------------------------------------------------------------------------------


def dockerfile_stages() -> dict[str, list[str]]:
    """Stage name -> its instructions (continuation lines joined, comments dropped)."""
    text = re.sub(r"\\\n", " ", (DEPLOY / "Dockerfile").read_text())
    stages: dict[str, list[str]] = {"": []}
    current = ""
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = re.match(r"FROM\s+(\S+)\s+AS\s+(\S+)$", line, re.IGNORECASE)
        if match:
            current = match[2]
            stages[current] = [line]
        else:
            stages[current].append(line)
    return stages


def test_dockerfile_has_one_small_unprivileged_target_per_service():
    stages = dockerfile_stages()
    assert "ARG BASE_IMAGE=python:3.11-slim" in stages[""]
    assert stages["runtime"][0] == "FROM ${BASE_IMAGE} AS runtime"
    assert f"--uid {UID}" in " ".join(stages["runtime"])
    for service in SERVICES:
        assert service in cli.COMMANDS
        lines = stages[service]
        assert lines[0] == f"FROM runtime AS {service}", "final stages start from runtime"
        assert f"USER {UID}:{UID}" in lines, service
        entrypoints = [json.loads(line[len("ENTRYPOINT") :]) for line in lines if "ENTRY" in line]
        assert entrypoints == [["apexrl", service]], service
        # Only the virtual environment comes over: no compilers, pip caches or sources.
        copies = [line for line in lines if line.startswith("COPY")]
        assert len(copies) == 1 and copies[0].endswith(" /opt/venv /opt/venv"), service
        assert not any(line.startswith("RUN") for line in lines), service


def test_dockerfile_replay_has_no_torch_and_learner_can_be_cpu():
    stages = dockerfile_stages()
    source = {name: re.search(r"--from=(\S+)", " ".join(stages[name]))[1] for name in SERVICES}
    replay_build = " ".join(stages[source["replay"]])
    assert "torch" not in replay_build and "RUN pip install ." in replay_build
    assert "[" not in replay_build.split("RUN pip install", 1)[1]
    assert source["actor"] == source["evaluator"]
    assert "CPU_TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu" in " ".join(
        stages[source["actor"]]
    )
    # The learner's environment is a stage LEARNER_TORCH picks: CUDA torch by default, or the
    # actor's CPU environment, built once.
    assert stages[source["learner"]][0].startswith("FROM ${LEARNER_TORCH}-torch-build AS ")
    assert "ARG LEARNER_TORCH=cuda" in stages[""]
    assert source["actor"] == "cpu-torch-build"
    learner_build = " ".join(stages["cuda-torch-build"])
    assert "ARG TORCH_VARIANT=cu" in learner_build
    assert "ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/${TORCH_VARIANT}" in learner_build


def test_dockerignore_keeps_what_the_dockerfile_copies():
    rules = (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
    kept = {r[1:].rstrip("/") for r in rules if r.startswith("!")}
    assert "*" in rules
    for lines in dockerfile_stages().values():
        for line in lines:
            if line.startswith("COPY") and "--from" not in line:
                sources = line.split()[1:-1]
                assert {s.rstrip("/") for s in sources} <= kept, line
                assert all((REPO / s).exists() for s in sources), line
