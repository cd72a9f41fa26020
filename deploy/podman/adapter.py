"""Test-only: turns apexrl's Kubernetes manifests into what `podman kube play` can run.

    python deploy/podman/adapter.py OUT_DIR [MANIFEST ...]      (no MANIFEST: YAML on stdin)
    kubectl kustomize deploy/kustomize/overlays/cpu-only | python deploy/podman/adapter.py OUT

writes one file per Deployment, OUT_DIR/<name>.yaml, holding that Deployment and the
ConfigMaps and PersistentVolumeClaims it uses, and one file per StatefulSet pod,
OUT_DIR/<name>-<ordinal>.yaml (below), for
`podman kube play --network NET:alias=<Service>[,alias=...] OUT_DIR/<file>.yaml` (an alias
stands in for a Service's cluster DNS name; `network_option()` writes the value). It changes
only what podman cannot do or does differently:

- Namespace, Service, NetworkPolicy, ServiceAccount, PodDisruptionBudget: podman has no such
  objects; they are left out (a Service's name becomes the `alias=` above, see `services()`).
- StatefulSet: podman 4.3 does not run one (alone in a file: "YAML document does not contain
  any supported kube kind"; beside other documents it is skipped without a word). Each
  ordinal becomes what the StatefulSet controller would make of it: a Pod named
  `<name>-<ordinal>` with that host name (so `--shard=hostname` reads the ordinal), and for
  each volumeClaimTemplate a volume `<claim>-<name>-<ordinal>` in place of its claim. No
  PersistentVolumeClaim document comes with it: podman makes a named volume the first time a
  pod mounts it and keeps it after `kube down`, as Kubernetes keeps a StatefulSet's claims when
  it scales down, so a pod played again finds its data (a PVC document for a volume that
  exists fails the play: "volume already exists"). Scaling is playing the next ordinal's file,
  or `kube down` of the highest one's. Its aliases are the Services that select it and
  `<name>-<ordinal>.<serviceName>`, the pod's own DNS name under a headless Service. No
  controller: nothing recreates a pod that is gone, and no rolling update is run.
- containerPorts: podman 4 publishes every containerPort on the host, so replicas collide;
  they are removed (pods are reached on their own IPs in the podman network). Probes go
  too: podman never runs readiness/startup probes, has no gRPC probe, and resolves a named
  probe port through the containerPorts just removed. tests/e2e/test_kubernetes.py sends
  each probe's request to the pod itself instead (gRPC health Check, HTTP GET); nothing
  restarts a pod or holds its traffic back on a failing probe.
- emptyDir: podman 4.3 makes an emptyDir a volume named after it, shared by every pod that
  names it the same (and it ignores `medium: Memory`), so every /tmp would be one; each is
  renamed <deployment>-<name> (<pod>-<name> for a StatefulSet's pod), which keeps
  Deployments and StatefulSet pods apart (replicas of one Deployment still share it).
- Extended resources (`nvidia.com/gpu`) and tolerations: no device plugin, no scheduler.
- `replicas` can be overridden (`--replicas actor=3`) to scale a Deployment or a StatefulSet;
  the test runs 1 actor, then 3, where the manifest has 4 (this kind of machine has 2 cores).

Everything else (image, args, env, ConfigMap volume, PVCs as podman volumes, emptyDirs,
user, read-only root filesystem, dropped capabilities, resource limits) is played as written.
"""

from __future__ import annotations

import argparse
import copy
import re
import sys
from pathlib import Path

import yaml

IGNORED_KINDS = {"Namespace", "Service", "NetworkPolicy", "ServiceAccount", "PodDisruptionBudget"}
WORKLOAD_KINDS = {"Deployment", "StatefulSet"}


class _Dumper(yaml.SafeDumper):
    """Writes multi-line strings (the ConfigMap's TOML) as readable `|` blocks."""


_Dumper.add_representer(
    str,
    lambda dumper, s: dumper.represent_scalar(
        "tag:yaml.org,2002:str", s, style="|" if "\n" in s else None
    ),
)


def load(texts: list[str]) -> list[dict]:
    return [doc for text in texts for doc in yaml.safe_load_all(text) if doc]


def network_option(network: str, aliases: list[str]) -> str:
    """`--network` value: NET:alias=A,alias=B (options are comma-separated; a second
    `:alias=` would become part of the first alias)."""
    return network + (":" + ",".join(f"alias={a}" for a in aliases) if aliases else "")


def workload_of(pod: str) -> str:
    """The Deployment or StatefulSet a played pod belongs to: podman names a Deployment's
    pods <name>-pod-<i>, this adapter a StatefulSet's <name>-<ordinal>."""
    return re.sub(r"-pod-\d+$|-\d+$", "", pod)


def services(docs: list[dict]) -> dict[str, list[str]]:
    """Workload name -> the names of the Services whose selector picks its pods."""
    found: dict[str, list[str]] = {}
    for workload in (d for d in docs if d["kind"] in WORKLOAD_KINDS):
        labels = workload["spec"]["template"]["metadata"].get("labels", {})
        found[workload["metadata"]["name"]] = [
            svc["metadata"]["name"]
            for svc in docs
            if svc["kind"] == "Service"
            and svc["spec"].get("selector")
            and svc["spec"]["selector"].items() <= labels.items()
        ]
    return found


def adapt_pod_spec(pod: dict, prefix: str) -> None:
    """What podman cannot run or runs differently, in place; emptyDirs get `prefix`."""
    pod.pop("tolerations", None)
    renamed = set()
    for volume in pod.get("volumes", []):
        if "emptyDir" in volume:
            renamed.add(volume["name"])
            volume["name"] = prefix + volume["name"]
    for container in pod.get("containers", []) + pod.get("initContainers", []):
        container.pop("ports", None)
        for mount in container.get("volumeMounts", []):
            if mount["name"] in renamed:
                mount["name"] = prefix + mount["name"]
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            container.pop(probe, None)
        for key in ("requests", "limits"):
            amounts = container.get("resources", {}).get(key, {})
            for name in [n for n in amounts if "/" in n]:  # extended resources
                del amounts[name]


def adapt_deployment(dep: dict, replicas: int | None = None) -> dict:
    dep = copy.deepcopy(dep)
    if replicas is not None:
        dep["spec"]["replicas"] = replicas
    adapt_pod_spec(dep["spec"]["template"]["spec"], dep["metadata"]["name"] + "-")
    return dep


def statefulset_pods(sts: dict, replicas: int | None = None) -> list[dict]:
    """The Pods the StatefulSet controller would make, ordinals 0 .. replicas - 1."""
    name = sts["metadata"]["name"]
    count = sts["spec"].get("replicas", 1) if replicas is None else replicas
    template = sts["spec"]["template"]
    pods = []
    for ordinal in range(count):
        pod_name = f"{name}-{ordinal}"
        spec = copy.deepcopy(template["spec"])
        spec["hostname"] = pod_name
        spec.setdefault("volumes", []).extend(
            {"name": claim["metadata"]["name"],
             "persistentVolumeClaim": {"claimName": f"{claim['metadata']['name']}-{pod_name}"}}
            for claim in sts["spec"].get("volumeClaimTemplates", [])
        )  # fmt: skip
        adapt_pod_spec(spec, pod_name + "-")
        metadata = copy.deepcopy(template["metadata"])
        metadata["name"] = pod_name
        if "namespace" in sts["metadata"]:
            metadata["namespace"] = sts["metadata"]["namespace"]
        metadata.setdefault("labels", {})["statefulset.kubernetes.io/pod-name"] = pod_name
        pods.append({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec})
    return pods


def _used(workload: dict, by_name: dict) -> list[dict]:
    """The ConfigMaps and PersistentVolumeClaims a workload's pod template names."""
    used: list[dict] = []
    for volume in workload["spec"]["template"]["spec"].get("volumes", []):
        if "configMap" in volume:
            used.append(by_name[("ConfigMap", volume["configMap"]["name"])])
        elif "persistentVolumeClaim" in volume:
            claim = volume["persistentVolumeClaim"]["claimName"]
            used.append(by_name[("PersistentVolumeClaim", claim)])
    return used


def workloads(docs: list[dict], replicas: dict[str, int] | None = None) -> dict[str, dict]:
    """Play unit -> {"workload", "docs"}: a Deployment is one unit under its own name, a
    StatefulSet one unit per pod (<name>-<ordinal>), each with what its kube play file holds."""
    replicas = replicas or {}
    played = WORKLOAD_KINDS | {"ConfigMap", "PersistentVolumeClaim"}
    kinds = {d["kind"] for d in docs} - IGNORED_KINDS - played
    if kinds:
        raise ValueError(f"no podman equivalent for {sorted(kinds)}")
    by_name = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    out: dict[str, dict] = {}
    for workload in (d for d in docs if d["kind"] in WORKLOAD_KINDS):
        name = workload["metadata"]["name"]
        used = _used(workload, by_name)
        if workload["kind"] == "Deployment":
            dep = adapt_deployment(workload, replicas.get(name))
            out[name] = {"workload": name, "docs": [*used, dep]}
        else:
            for pod in statefulset_pods(workload, replicas.get(name)):
                out[pod["metadata"]["name"]] = {"workload": name, "docs": [*used, pod]}
    return out


def write(out_dir: Path, docs: list[dict], replicas: dict[str, int] | None = None) -> dict:
    """Writes OUT_DIR/<unit>.yaml; returns {unit: {"file", "aliases", "workload"}}, units in
    manifest order (a StatefulSet's pods by ordinal)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    aliases = services(docs)
    governing = {d["metadata"]["name"]: d["spec"].get("serviceName")
                 for d in docs if d["kind"] == "StatefulSet"}  # fmt: skip
    result = {}
    for unit, info in workloads(docs, replicas).items():
        name = info["workload"]
        path = out_dir / f"{unit}.yaml"
        path.write_text(yaml.dump_all(info["docs"], Dumper=_Dumper, sort_keys=False))
        names = list(aliases[name])
        if governing.get(name):  # the pod's own name under its headless Service
            names.append(f"{unit}.{governing[name]}")
        result[unit] = {"file": str(path), "aliases": names, "workload": name}
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("manifests", nargs="*", type=Path)
    parser.add_argument("--replicas", action="append", default=[], metavar="NAME=N")
    args = parser.parse_args(argv)
    texts = [p.read_text() for p in args.manifests] or [sys.stdin.read()]
    replicas = {k: int(v) for k, v in (r.split("=", 1) for r in args.replicas)}
    for unit, info in write(args.out_dir, load(texts), replicas).items():
        network = network_option("NET", info["aliases"])
        print(f"podman kube play --network {network} {info['file']}  # {unit}")


if __name__ == "__main__":
    main()
