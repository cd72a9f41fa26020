"""What deploy/ promises, checked without a cluster, a container engine or the network.

Every manifest in deploy/k8s and every kustomize rendering validates against the Kubernetes
OpenAPI schemas in strict mode; then what schemas cannot see: selectors, ports and probes
that meet, settings the code really reads (parsed with apexrl.config itself), images,
security, NetworkPolicy flows, the Prometheus Operator extras and the Dockerfile.
"""

import dataclasses
import functools
import json
import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from apexrl import cli, local
from apexrl import config as cfg

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
    "actor": cfg.ActorConfig,
    "evaluator": cfg.EvaluatorConfig,
}
GRPC_SERVERS = {"replay", "learner"}
BUNDLES = ["k8s", "base", "overlays/cpu-only", "overlays/large", "overlays/dpg", "overlays/atari"]
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


def deployments(docs: list[dict]) -> dict[str, dict]:
    return {doc["metadata"]["name"]: doc for doc in of_kind(docs, "Deployment")}


def pod_spec(deployment: dict) -> dict:
    return deployment["spec"]["template"]["spec"]


def pod_labels(deployment: dict) -> dict:
    return deployment["spec"]["template"]["metadata"]["labels"]


def container(deployment: dict) -> dict:
    containers = pod_spec(deployment)["containers"]
    assert len(containers) == 1, f"{deployment['metadata']['name']}: one container per pod"
    return containers[0]


def container_ports(deployment: dict) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in container(deployment).get("ports", [])}


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


def effective_config(docs: list[dict], name: str, tmp_path: Path, monkeypatch):
    """The settings `apexrl <name>` would run with in this pod, parsed by apexrl.config."""
    deployment = deployments(docs)[name]
    spec, box = pod_spec(deployment), container(deployment)
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
        return cfg.parse(SERVICES[name], args, name, f"apexrl {name}")
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
        assert {"Deployment", "ServiceAccount"} <= kinds, name
        if name in GRPC_SERVERS:
            assert {"Service", "PersistentVolumeClaim"} <= kinds, name


# --- wiring --------------------------------------------------------------------------------


def test_deployment_selectors_match_pod_labels(bundle):
    name, docs = bundle
    assert set(deployments(docs)) == set(SERVICES), name
    for deployment_name, deployment in deployments(docs).items():
        selector = deployment["spec"]["selector"]
        assert not selector.get("matchExpressions"), deployment_name
        assert selector["matchLabels"], deployment_name
        assert selects(selector, pod_labels(deployment)), deployment_name
        assert pod_labels(deployment)["app.kubernetes.io/name"] == deployment_name
        assert container(deployment)["name"] == deployment_name
        others = [d for n, d in deployments(docs).items() if n != deployment_name]
        assert not any(selects(selector, pod_labels(d)) for d in others), deployment_name


def test_services_select_one_deployment_and_target_its_ports(bundle):
    name, docs = bundle
    services = {s["metadata"]["name"]: s for s in of_kind(docs, "Service")}
    assert set(services) == GRPC_SERVERS, name
    for service_name, service in services.items():
        matched = [
            d
            for d in deployments(docs).values()
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
    for deployment_name, deployment in deployments(docs).items():
        box, ports = container(deployment), container_ports(deployment)
        expected_ports = {"grpc", "metrics"} if deployment_name in GRPC_SERVERS else {"metrics"}
        assert set(ports) == expected_ports, deployment_name
        assert box.get("readinessProbe") and box.get("livenessProbe"), deployment_name
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            probe = box.get(kind)
            if probe is None:
                continue
            where = f"{name}: {deployment_name} {kind}"
            if deployment_name in GRPC_SERVERS:
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
    for deployment_name, deployment in deployments(docs).items():
        config = effective_config(docs, deployment_name, tmp_path, monkeypatch)
        ports, spec = container_ports(deployment), pod_spec(deployment)
        where = f"{name}: {deployment_name}"
        assert config.host == "0.0.0.0", where
        assert config.metrics_port == ports["metrics"], where
        annotations = deployment["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true", where
        assert annotations["prometheus.io/port"] == str(config.metrics_port), where
        assert annotations["prometheus.io/path"] == "/metrics", where
        if deployment_name in GRPC_SERVERS:
            assert config.port == ports["grpc"], where
            # The checkpoints go to the mounted volume, and SIGTERM leaves time to write them.
            mounts = {m["mountPath"]: m["name"] for m in container(deployment)["volumeMounts"]}
            volume = {v["name"]: v for v in spec["volumes"]}[mounts[config.checkpoint_dir]]
            assert volume["persistentVolumeClaim"]["claimName"] in claims, where
            assert spec["terminationGracePeriodSeconds"] >= config.grace_seconds + 30, where
        # Peer addresses are Service DNS names and ports that lead to that peer's gRPC port.
        for peer in ("replay", "learner"):
            address = getattr(config, peer, None)
            if address is None or not isinstance(address, str):
                continue
            host, _, port = address.rpartition(":")
            assert host in (peer, f"{peer}.{NAMESPACE}", f"{peer}.{NAMESPACE}.svc"), where
            service_ports = {p["port"]: p for p in services[peer]["spec"]["ports"]}
            assert service_ports[int(port)]["targetPort"] == "grpc", where


def test_every_flag_and_env_var_is_a_setting_of_the_service(bundle):
    name, docs = bundle
    for deployment_name, deployment in deployments(docs).items():
        box, cls = container(deployment), SERVICES[deployment_name]
        fields = {f.name for f in dataclasses.fields(cls)}
        assert "command" not in box, f"{deployment_name}: the image's entrypoint runs apexrl"
        flags = {"--config"} | {"--" + f.replace("_", "-") for f in fields}
        for arg in box.get("args", []):
            assert arg.startswith("--") and "=" in arg, f"{deployment_name}: write --flag=value"
            assert arg.split("=", 1)[0] in flags, f"{deployment_name}: unknown flag {arg}"
        env_names = {"APEXRL_CONFIG"} | {cfg.env_name(f) for f in fields}
        for env in box.get("env", []):
            assert env["name"] in env_names, f"{deployment_name}: unknown env {env['name']}"


def test_images_are_named_consistently(bundle):
    name, docs = bundle
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    suffix = {"learner": "-cpu"} if name == "overlays/cpu-only" else {}
    for deployment_name, deployment in deployments(docs).items():
        expected = f"apexrl/{deployment_name}:{version}{suffix.get(deployment_name, '')}"
        assert container(deployment)["image"] == expected, name
        assert container(deployment)["imagePullPolicy"] == "IfNotPresent", name


# --- workload shape ------------------------------------------------------------------------


def test_replay_and_learner_are_single_replicas_replaced_whole(bundle):
    name, docs = bundle
    for service in GRPC_SERVERS:
        spec = deployments(docs)[service]["spec"]
        assert spec["replicas"] == 1 and spec["strategy"] == {"type": "Recreate"}, service


def test_actor_replicas_are_the_scale_knob(bundle):
    name, docs = bundle
    actor = deployments(docs)["actor"]
    expected = {"overlays/large": 32, "overlays/atari": 16}.get(name, 4)
    assert actor["spec"]["replicas"] == expected
    assert actor["spec"].get("strategy", {}).get("type", "RollingUpdate") == "RollingUpdate"


def test_learner_gpu_request(bundle):
    name, docs = bundle
    for deployment_name, deployment in deployments(docs).items():
        resources = container(deployment)["resources"]
        gpus = [resources[k].get("nvidia.com/gpu") for k in ("requests", "limits")]
        if deployment_name == "learner" and name != "overlays/cpu-only":
            assert gpus == [1, 1], name
        else:
            assert gpus == [None, None], f"{name}: {deployment_name}"
            assert not pod_spec(deployment).get("tolerations"), f"{name}: {deployment_name}"


QUANTITY = re.compile(r"^([0-9.]+)(m|Ki|Mi|Gi|Ti|k|M|G|T)?$")
SCALE = {None: 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
SCALE |= {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def quantity(value) -> float:
    match = QUANTITY.match(str(value))
    assert match, f"not a quantity: {value!r}"
    return float(match[1]) * SCALE[match[2]]


def test_resources_have_requests_within_limits(bundle):
    name, docs = bundle
    for deployment_name, deployment in deployments(docs).items():
        resources = container(deployment)["resources"]
        for resource in ("cpu", "memory"):
            request = quantity(resources["requests"][resource])
            limit = quantity(resources["limits"][resource])
            assert 0 < request <= limit, f"{name}: {deployment_name} {resource}"


def test_large_overlay_gives_replay_more_memory():
    base = container(deployments(bundle_docs("base"))["replay"])["resources"]["limits"]
    large = container(deployments(bundle_docs("overlays/large"))["replay"])["resources"]["limits"]
    assert quantity(large["memory"]) > quantity(base["memory"])


# --- security ------------------------------------------------------------------------------


def test_every_pod_runs_unprivileged(bundle):
    name, docs = bundle
    accounts = {a["metadata"]["name"]: a for a in of_kind(docs, "ServiceAccount")}
    for deployment_name, deployment in deployments(docs).items():
        spec, box = pod_spec(deployment), container(deployment)
        where = f"{name}: {deployment_name}"
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
        mounts = {m["mountPath"]: m for m in box["volumeMounts"]}
        assert "emptyDir" in volumes[mounts["/tmp"]["name"]], where
        for mount in mounts.values():
            volume = volumes[mount["name"]]
            if "configMap" in volume:
                assert mount.get("readOnly") is True, where
            else:
                assert {"emptyDir", "persistentVolumeClaim"} & set(volume), where


# --- configuration -------------------------------------------------------------------------


def test_config_map_parses_for_every_service(bundle, tmp_path):
    name, docs = bundle
    text = config_toml(docs)
    data = tomllib.loads(text)
    assert {k for k, v in data.items() if isinstance(v, dict)} == set(SERVICES), name
    # parse() ignores top-level keys no service has (they are shared): catch typos here.
    known = {f.name for cls in SERVICES.values() for f in dataclasses.fields(cls)}
    unknown = {k for k, v in data.items() if not isinstance(v, dict)} - known
    assert not unknown, f"{name}: top-level keys no service reads: {unknown}"
    path = tmp_path / CONFIG_KEY
    path.write_text(text)
    configs = {}
    for section, cls in SERVICES.items():
        try:
            configs[section] = cfg.parse(cls, ["--config", str(path)], section, f"apexrl {section}")
        except SystemExit:
            pytest.fail(f"{name}: [{section}] of {CONFIG_KEY} is rejected (see stderr)")
    # The learner, actors and evaluator agree on the agent (only set at the top level).
    agent = [f.name for f in dataclasses.fields(cfg.AgentConfig)]
    for section in ("learner", "actor", "evaluator"):
        assert not set(data[section]) & set(agent), f"{name}: [{section}] sets agent keys"
        values = [getattr(configs[section], field) for field in agent]
        assert values == [getattr(configs["learner"], field) for field in agent]
    # The replay refuses what the algorithm would not learn from (local mode derives the same).
    assert configs["replay"].signature == local.signature(configs["learner"]), name


def test_dpg_overlay_switches_the_whole_stack_by_its_agent_settings():
    base = tomllib.loads(config_toml(bundle_docs("base")))
    dpg = tomllib.loads(config_toml(bundle_docs("overlays/dpg")))
    assert (dpg["algorithm"], dpg["env"]) == ("dpg", "Pendulum-v1")
    assert "action:float32:1:-2..2" in dpg["replay"]["signature"]
    for table in ("replay", "learner", "actor", "evaluator"):  # the same keys, tuned values
        assert set(dpg[table]) == set(base[table]), table


def test_atari_overlay_runs_pong_from_compressed_frames_with_room_for_2m_transitions():
    atari = tomllib.loads(config_toml(bundle_docs("overlays/atari")))
    assert atari["env"].startswith("ALE/") and atari["replay"]["capacity"] == 2_000_000
    assert atari["replay"]["signature"].startswith("observations:uint8:2x4x84x84:zstd,")
    replay = container(deployments(bundle_docs("overlays/atari"))["replay"])["resources"]
    # benchmarks/atari.py: ~0.46 KB a stored Pong transition, ~1.9 KB MsPacman.
    assert quantity(replay["requests"]["memory"]) >= 2_000_000 * 0.46e3
    assert quantity(replay["limits"]["memory"]) >= 2_000_000 * 1.9e3


def test_large_overlay_config_differs_only_in_replay():
    base = tomllib.loads(config_toml(bundle_docs("base")))
    large = tomllib.loads(config_toml(bundle_docs("overlays/large")))
    assert {k: v for k, v in large.items() if k != "replay"} == {
        k: v for k, v in base.items() if k != "replay"
    }
    assert large["replay"]["capacity"] > base["replay"]["capacity"]
    assert set(large["replay"]) == set(base["replay"])


# --- network policies ----------------------------------------------------------------------

ANY_NAMESPACE = "*"


def allowed_flows(docs: list[dict]) -> set[tuple[str, str, str]]:
    """(source, target, port name) the NetworkPolicies let in; source '*' is any namespace."""
    pods = {name: pod_labels(d) for name, d in deployments(docs).items()}
    flows = set()
    for policy in of_kind(docs, "NetworkPolicy"):
        spec = policy["spec"]
        assert spec["policyTypes"] == ["Ingress"], policy["metadata"]["name"]
        targets = [n for n, labels in pods.items() if selects(spec["podSelector"], labels)]
        for rule in spec.get("ingress", []):
            sources = set()
            for peer in rule["from"]:
                assert "ipBlock" not in peer, policy["metadata"]["name"]
                if "namespaceSelector" in peer:
                    assert peer == {"namespaceSelector": {}}, policy["metadata"]["name"]
                    sources.add(ANY_NAMESPACE)
                else:
                    sources |= {n for n, lab in pods.items() if selects(peer["podSelector"], lab)}
            for target in targets:
                names = {v: k for k, v in container_ports(deployments(docs)[target]).items()}
                for port in rule["ports"]:
                    assert port.get("protocol", "TCP") == "TCP"
                    port_name = (
                        port["port"] if isinstance(port["port"], str) else names[port["port"]]
                    )
                    assert port_name in names.values(), f"{target} has no port {port_name}"
                    flows |= {(source, target, port_name) for source in sources}
    return flows


def test_network_policies_allow_exactly_the_service_flows(bundle):
    name, docs = bundle
    deny = named(docs, "NetworkPolicy", "default-deny-ingress")["spec"]
    assert deny == {"podSelector": {}, "policyTypes": ["Ingress"]}
    expected = {
        ("actor", "replay", "grpc"),
        ("learner", "replay", "grpc"),
        ("actor", "learner", "grpc"),
        ("evaluator", "learner", "grpc"),
    } | {(ANY_NAMESPACE, service, "metrics") for service in SERVICES}
    assert allowed_flows(docs) == expected, name


# --- monitoring extras (Prometheus Operator, not applied by `kubectl apply -f deploy/k8s/`) -


def readme_metrics() -> set[str]:
    """Metric names in README.md's metrics table.

    A row may abbreviate: `apexrl_learner_loss`, `_td_error_mean` shares a prefix with the
    row's first name, so `_suffix` entries count with every prefix of that name.
    """
    names = set()
    for line in (REPO / "README.md").read_text().splitlines():
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
    docs, pods = monitoring_docs(), deployments(plain_manifests())
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
        "ApexrlCheckpointFailing": "apexrl_learner_checkpoint_failures_total",
    }
    assert set(alerts) == set(watched)
    documented = readme_metrics()
    for alert, rule in alerts.items():
        metrics = promql_metrics(rule["expr"])
        assert watched[alert] in metrics, alert
        ours = {m for m in metrics if m.startswith(("apexrl_", "grpc_", "process_"))}
        assert ours <= documented, f"{alert}: not in README's metrics table: {ours - documented}"
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
    replay_code = (DEPLOY.parent / "services" / "replay" / "server.py").read_text()
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
    learner_build = " ".join(stages[source["learner"]])
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
