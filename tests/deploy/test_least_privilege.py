"""Least privilege in the rendered manifests: the namespace enforces the Pod Security
Standard `restricted` and every pod of every bundle passes it, each of the standard's rules
checked by its name (kubernetes.io/docs/concepts/security/pod-security-standards); the
replay shards and the learner have PodDisruptionBudgets that a drain respects.

Each rule is a function of a pod spec returning what breaks it; each is shown to catch a pod
that breaks it, so a rule that checks nothing fails here.
"""

import copy

import pytest

from tests.deploy import test_manifests as tm

# Baseline's allowed capability additions and safe sysctls, and restricted's volume types.
BASELINE_CAPABILITIES = {
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
    "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
}  # fmt: skip
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}  # fmt: skip
RESTRICTED_VOLUMES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
    "projected", "secret",
}  # fmt: skip
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}


def containers(pod: dict) -> list[dict]:
    return [*pod.get("initContainers", []), *pod["containers"], *pod.get("ephemeralContainers", [])]


def contexts(pod: dict) -> list[tuple[str, dict]]:
    """(where, securityContext) of the pod and of each container."""
    return [("pod", pod.get("securityContext", {}))] + [
        (c["name"], c.get("securityContext", {})) for c in containers(pod)
    ]


def effective(pod: dict, container: dict, key: str):
    """A container's setting, else the pod's (runAsNonRoot, runAsUser, seccompProfile)."""
    own = container.get("securityContext", {})
    return own[key] if key in own else pod.get("securityContext", {}).get(key)


def host_process(pod):
    return [w for w, sc in contexts(pod) if sc.get("windowsOptions", {}).get("hostProcess")]


def host_namespaces(pod):
    return [key for key in ("hostNetwork", "hostPID", "hostIPC") if pod.get(key)]


def privileged_containers(pod):
    return [c["name"] for c in containers(pod) if c.get("securityContext", {}).get("privileged")]


def baseline_capabilities(pod):
    return [
        f"{c['name']} adds {cap}"
        for c in containers(pod)
        for cap in c.get("securityContext", {}).get("capabilities", {}).get("add", [])
        if cap not in BASELINE_CAPABILITIES
    ]


def hostpath_volumes(pod):
    return [v["name"] for v in pod.get("volumes", []) if "hostPath" in v]


def host_ports(pod):
    return [
        f"{c['name']}:{p['hostPort']}" for c in containers(pod) for p in c.get("ports", [])
        if p.get("hostPort")
    ]  # fmt: skip


def apparmor(pod):
    return [
        w for w, sc in contexts(pod)
        if sc.get("appArmorProfile", {}).get("type", "RuntimeDefault") == "Unconfined"
    ]  # fmt: skip


def selinux(pod):
    return [
        w for w, sc in contexts(pod)
        if sc.get("seLinuxOptions", {}).get("type", "") not in SELINUX_TYPES
        or {"user", "role"} & set(sc.get("seLinuxOptions", {}))
    ]  # fmt: skip


def proc_mount(pod):
    return [
        c["name"] for c in containers(pod)
        if c.get("securityContext", {}).get("procMount", "Default") != "Default"
    ]  # fmt: skip


def baseline_seccomp(pod):
    return [
        w for w, sc in contexts(pod) if sc.get("seccompProfile", {}).get("type") == "Unconfined"
    ]


def sysctls(pod):
    return [
        s["name"] for s in pod.get("securityContext", {}).get("sysctls", [])
        if s["name"] not in SAFE_SYSCTLS
    ]  # fmt: skip


def volume_types(pod):
    return [
        f"{v['name']}: {sorted(set(v) - {'name'})}" for v in pod.get("volumes", [])
        if not (set(v) - {"name"}) <= RESTRICTED_VOLUMES
    ]  # fmt: skip


def privilege_escalation(pod):
    return [
        c["name"] for c in containers(pod)
        if c.get("securityContext", {}).get("allowPrivilegeEscalation") is not False
    ]  # fmt: skip


def running_as_non_root(pod):
    return [c["name"] for c in containers(pod) if effective(pod, c, "runAsNonRoot") is not True]


def running_as_non_root_user(pod):
    return [w for w, sc in contexts(pod) if sc.get("runAsUser") == 0]


def restricted_seccomp(pod):
    return [
        c["name"] for c in containers(pod)
        if (effective(pod, c, "seccompProfile") or {}).get("type") not in ("RuntimeDefault", "Localhost")
    ]  # fmt: skip


def restricted_capabilities(pod):
    broken = []
    for c in containers(pod):
        capabilities = c.get("securityContext", {}).get("capabilities", {})
        if "ALL" not in capabilities.get("drop", []):
            broken.append(f"{c['name']} does not drop ALL")
        broken += [f"{c['name']} adds {cap}" for cap in capabilities.get("add", [])
                   if cap != "NET_BIND_SERVICE"]  # fmt: skip
    return broken


# The standard's rules by their names, and a change to a passing pod that breaks each.
RULES = {
    "HostProcess": (host_process, lambda p: p["containers"][0]["securityContext"].update(
        windowsOptions={"hostProcess": True})),
    "Host Namespaces": (host_namespaces, lambda p: p.update(hostNetwork=True)),
    "Privileged Containers": (privileged_containers,
                              lambda p: p["containers"][0]["securityContext"].update(privileged=True)),
    "Capabilities (baseline)": (baseline_capabilities, lambda p: p["containers"][0][
        "securityContext"]["capabilities"].update(add=["SYS_ADMIN"])),
    "HostPath Volumes": (hostpath_volumes, lambda p: p["volumes"].append(
        {"name": "host", "hostPath": {"path": "/"}})),
    "Host Ports": (host_ports, lambda p: p["containers"][0].setdefault("ports", []).append(
        {"containerPort": 80, "hostPort": 80})),
    "AppArmor": (apparmor, lambda p: p["securityContext"].update(
        appArmorProfile={"type": "Unconfined"})),
    "SELinux": (selinux, lambda p: p["securityContext"].update(seLinuxOptions={"type": "spc_t"})),
    "/proc Mount Type": (proc_mount, lambda p: p["containers"][0]["securityContext"].update(
        procMount="Unmasked")),
    "Seccomp (baseline)": (baseline_seccomp, lambda p: p["containers"][0]["securityContext"].update(
        seccompProfile={"type": "Unconfined"})),
    "Sysctls": (sysctls, lambda p: p["securityContext"].update(
        sysctls=[{"name": "kernel.msgmax", "value": "1"}])),
    "Volume Types": (volume_types, lambda p: p["volumes"].append(
        {"name": "nfs", "nfs": {"server": "x", "path": "/"}})),
    "Privilege Escalation": (privilege_escalation, lambda p: p["containers"][0][
        "securityContext"].pop("allowPrivilegeEscalation")),
    "Running as Non-root": (running_as_non_root, lambda p: [
        sc.pop("runAsNonRoot", None) for _, sc in contexts(p)]),
    "Running as Non-root user": (running_as_non_root_user,
                                 lambda p: p["securityContext"].update(runAsUser=0)),
    "Seccomp": (restricted_seccomp, lambda p: [sc.pop("seccompProfile", None)
                                               for _, sc in contexts(p)]),
    "Capabilities": (restricted_capabilities, lambda p: p["containers"][0]["securityContext"][
        "capabilities"].update(drop=["NET_RAW"])),
}  # fmt: skip


def pods(docs: list[dict]) -> dict[str, dict]:
    return {name: tm.pod_spec(w) for name, w in tm.workloads(docs).items()}


ALL_BUNDLES = tm.BUNDLES + tm.OTHER_BUNDLES


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("bundle", ALL_BUNDLES)
def test_every_pod_passes_the_restricted_standard(bundle, rule):
    check, _ = RULES[rule]
    for name, pod in pods(tm.bundle_docs(bundle)).items():
        assert not check(pod), f"{bundle}: {name} breaks {rule!r}: {check(pod)}"


@pytest.mark.parametrize("rule", RULES)
def test_each_rule_catches_a_pod_that_breaks_it(rule):
    check, breaking = RULES[rule]
    for name, pod in pods(tm.bundle_docs("base")).items():
        broken = copy.deepcopy(pod)
        breaking(broken)
        assert check(broken), f"{rule!r} does not see the change made to {name}"


def test_the_namespace_enforces_restricted():
    for bundle in ALL_BUNDLES:
        (namespace,) = tm.of_kind(tm.bundle_docs(bundle), "Namespace")
        labels = namespace["metadata"]["labels"]
        for mode in ("enforce", "audit", "warn"):
            assert labels[f"pod-security.kubernetes.io/{mode}"] == "restricted", (bundle, mode)
            assert labels[f"pod-security.kubernetes.io/{mode}-version"] == "latest", (bundle, mode)


@pytest.mark.parametrize("bundle", ALL_BUNDLES)
def test_disruption_budgets_let_one_shard_go_and_keep_the_learner(bundle):
    """A drain evicts one replay shard at a time; the one learner waits for an operator. Pods
    that are not ready anyway may always go, so a broken pod never blocks a drain."""
    docs = tm.bundle_docs(bundle)
    budgets = {b["metadata"]["name"]: b["spec"] for b in tm.of_kind(docs, "PodDisruptionBudget")}
    assert set(budgets) == {"replay", "learner"}, bundle
    workloads = tm.workloads(docs)
    for name, spec in budgets.items():
        matched = [
            n for n, w in workloads.items() if tm.selects(spec["selector"], tm.pod_labels(w))
        ]
        assert matched == [name], (bundle, name)
        assert spec["unhealthyPodEvictionPolicy"] == "AlwaysAllow", (bundle, name)
    assert budgets["replay"]["maxUnavailable"] == 1 and "minAvailable" not in budgets["replay"]
    assert budgets["learner"]["minAvailable"] == workloads["learner"]["spec"]["replicas"] == 1
