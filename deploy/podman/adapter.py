"""Test-only: turns apexrl's Kubernetes manifests into what `podman kube play` can run.

    python deploy/podman/adapter.py OUT_DIR [MANIFEST ...]      (no MANIFEST: YAML on stdin)
    kubectl kustomize deploy/kustomize/overlays/cpu-only | python deploy/podman/adapter.py OUT

writes one file per Deployment, OUT_DIR/<name>.yaml, holding that Deployment and the
ConfigMaps and PersistentVolumeClaims it uses, for
`podman kube play --network NET:alias=<Service> OUT_DIR/<name>.yaml` (the alias stands in
for the Service's cluster DNS name). It changes only what podman cannot do or does differently:

- Namespace, Service, NetworkPolicy, ServiceAccount: podman has no such objects; they are
  left out (a Service's name becomes the `alias=` above, see `services()`).
- containerPorts: podman 4 publishes every containerPort on the host, so replicas collide;
  they are removed (pods are reached on their own IPs in the podman network). Probes go
  too: podman never runs readiness/startup probes, has no gRPC probe, and resolves a named
  probe port through the containerPorts just removed. tests/e2e/test_kubernetes.py sends
  each probe's request to the pod itself instead (gRPC health Check, HTTP GET); nothing
  restarts a pod or holds its traffic back on a failing probe.
- emptyDir: podman 4.3 makes an emptyDir a volume named after it, shared by every pod that
  names it the same (and it ignores `medium: Memory`), so every /tmp would be one; each is
  renamed <deployment>-<name>, which keeps Deployments apart (replicas of one still share it).
- Extended resources (`nvidia.com/gpu`) and tolerations: no device plugin, no scheduler.
- `replicas` can be overridden (`--replicas actor=3`) to scale a Deployment; the test runs
  1 actor, then 3, where the manifest has 4 (this kind of machine has 2 cores).

Everything else (image, args, env, ConfigMap volume, PVCs as podman volumes, emptyDirs,
user, read-only root filesystem, dropped capabilities, resource limits) is played as written.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import yaml

IGNORED_KINDS = {"Namespace", "Service", "NetworkPolicy", "ServiceAccount"}


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


def services(docs: list[dict]) -> dict[str, list[str]]:
    """Deployment name -> the names of the Services whose selector picks its pods."""
    found: dict[str, list[str]] = {}
    for dep in (d for d in docs if d["kind"] == "Deployment"):
        labels = dep["spec"]["template"]["metadata"].get("labels", {})
        found[dep["metadata"]["name"]] = [
            svc["metadata"]["name"]
            for svc in docs
            if svc["kind"] == "Service"
            and svc["spec"].get("selector")
            and svc["spec"]["selector"].items() <= labels.items()
        ]
    return found


def adapt_deployment(dep: dict, replicas: int | None = None) -> dict:
    dep = copy.deepcopy(dep)
    if replicas is not None:
        dep["spec"]["replicas"] = replicas
    pod = dep["spec"]["template"]["spec"]
    pod.pop("tolerations", None)
    prefix = dep["metadata"]["name"] + "-"
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
    return dep


def workloads(docs: list[dict], replicas: dict[str, int] | None = None) -> dict[str, list[dict]]:
    """Deployment name -> the documents of its kube play file."""
    replicas = replicas or {}
    played = {"Deployment", "ConfigMap", "PersistentVolumeClaim"}
    kinds = {d["kind"] for d in docs} - IGNORED_KINDS - played
    if kinds:
        raise ValueError(f"no podman equivalent for {sorted(kinds)}")
    by_name = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    out: dict[str, list[dict]] = {}
    for dep in (d for d in docs if d["kind"] == "Deployment"):
        name = dep["metadata"]["name"]
        used: list[dict] = []
        for volume in dep["spec"]["template"]["spec"].get("volumes", []):
            if "configMap" in volume:
                used.append(by_name[("ConfigMap", volume["configMap"]["name"])])
            elif "persistentVolumeClaim" in volume:
                claim = volume["persistentVolumeClaim"]["claimName"]
                used.append(by_name[("PersistentVolumeClaim", claim)])
        out[name] = [*used, adapt_deployment(dep, replicas.get(name))]
    return out


def write(out_dir: Path, docs: list[dict], replicas: dict[str, int] | None = None) -> dict:
    """Writes OUT_DIR/<deployment>.yaml; returns {deployment: {"file", "aliases"}}."""
    out_dir.mkdir(parents=True, exist_ok=True)
    aliases = services(docs)
    result = {}
    for name, parts in workloads(docs, replicas).items():
        path = out_dir / f"{name}.yaml"
        path.write_text(yaml.dump_all(parts, Dumper=_Dumper, sort_keys=False))
        result[name] = {"file": str(path), "aliases": aliases[name]}
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("manifests", nargs="*", type=Path)
    parser.add_argument("--replicas", action="append", default=[], metavar="NAME=N")
    args = parser.parse_args(argv)
    texts = [p.read_text() for p in args.manifests] or [sys.stdin.read()]
    replicas = {k: int(v) for k, v in (r.split("=", 1) for r in args.replicas)}
    for name, info in write(args.out_dir, load(texts), replicas).items():
        network = "".join(f":alias={a}" for a in info["aliases"])
        print(f"podman kube play --network NET{network} {info['file']}  # {name}")


if __name__ == "__main__":
    main()
