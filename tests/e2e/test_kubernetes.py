"""The Kubernetes deployment for real, without Kubernetes: the images built from
deploy/Dockerfile with podman, the cpu-only overlay's manifests run with `podman kube play`
(through the test-only deploy/podman/adapter.py), a real Prometheus scraping every pod.

Needs root, podman (configured as ../shared/TESTING.md says), debootstrap, prometheus and
promtool, kubectl: skipped when one is missing. The tests run in file order and share one
deployment (module fixture); the last one tears it down and checks nothing is left.
APEXRL_E2E_TRAIN_SECONDS (default 120) sets how long it trains before the first checks.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from tests.conftest import wait_for

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
NETWORK = "apexrl-e2e"
OVERLAY = ROOT / "deploy/kustomize/overlays/cpu-only"
ORDER = ["replay", "learner", "evaluator", "actor"]  # servers first, like a rollout
TRAIN_SECONDS = float(os.environ.get("APEXRL_E2E_TRAIN_SECONDS", "120"))
MISSING = [
    t for t in ("podman", "debootstrap", "prometheus", "promtool", "kubectl") if not shutil.which(t)
]

sys.path.insert(0, str(ROOT / "deploy/podman"))
import adapter  # noqa: E402

if MISSING or os.geteuid() != 0:
    # CI (.ci/run) installs all of it and sets APEXRL_REQUIRE_PODMAN=1: there, missing is a failure.
    if os.environ.get("APEXRL_REQUIRE_PODMAN") == "1":
        raise RuntimeError(f"tests/e2e/test_kubernetes.py needs root and {MISSING or 'podman'}")
    pytest.skip(f"needs root and {MISSING or 'podman'}", allow_module_level=True)


def sh(*args: str, check: bool = True, timeout: float = 600) -> str:
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(args)} -> {done.returncode}\n{done.stdout}\n{done.stderr}")
    return done.stdout


def logs(container: str, tail: int) -> str:
    """A container's output, stdout and stderr (where Python's logging writes) together."""
    args = ["podman", "logs", "--tail", str(tail), container]
    return subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True).stdout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Deployment:
    work: Path
    docs: list[dict]
    volumes_before: set[str]
    files: dict = field(default_factory=dict)  # deployment -> {"file", "aliases"}
    containers: set[str] = field(default_factory=set)  # every container id ever seen
    prometheus: subprocess.Popen | None = None
    prom_url: str = ""
    timings: dict = field(default_factory=dict)
    exit_codes: dict = field(default_factory=dict)
    down: bool = False

    # --- podman ---------------------------------------------------------------------------
    def play(self, name: str, replicas: int | None = None, replace: bool = False) -> None:
        """`kube play`s one Deployment; replace: `kube down` what was played of it first
        (podman 4.3's `kube play --replace` fails on a Deployment: "pod already exists")."""
        if replace:
            sh("podman", "kube", "down", self.files[name]["file"])
        counts = {"actor": 1, **({name: replicas} if replicas else {})}
        self.files = adapter.write(self.work / "play", self.docs, counts)
        info = self.files[name]
        network = NETWORK + "".join(f":alias={a}" for a in info["aliases"])
        sh("podman", "kube", "play", "--network", network, info["file"])

    def pods(self) -> list[dict]:
        """Our running pods' app containers: name, pod, deployment, ip, id."""
        out = []
        for c in json.loads(sh("podman", "ps", "-a", "--pod", "--format", "json") or "[]"):
            pod = c.get("PodName") or ""
            deployment = pod.rsplit("-pod-", 1)[0]
            if deployment not in ORDER or c.get("IsInfra"):
                continue
            self.containers.add(c["Id"])
            name = c["Names"][0]
            ip = sh("podman", "inspect", name, "--format",
                    "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}").strip()  # fmt: skip
            out.append(dict(name=name, pod=pod, deployment=deployment, ip=ip, id=c["Id"],
                            state=c["State"]))  # fmt: skip
        return out

    def logs(self) -> str:
        return "\n".join(
            f"--- {p['name']} ({p['state']})\n" + logs(p["name"], 30) for p in self.pods()
        )

    # --- Prometheus -------------------------------------------------------------------------
    def write_targets(self) -> int:
        """file_sd targets as the prometheus.io/* annotations describe each running pod."""
        templates = {
            d["metadata"]["name"]: d["spec"]["template"]
            for d in self.docs
            if d["kind"] == "Deployment"
        }
        groups = []
        for p in self.pods():
            if p["state"] != "running" or not p["ip"]:
                continue
            notes = templates[p["deployment"]]["metadata"]["annotations"]
            assert notes["prometheus.io/scrape"] == "true"
            groups.append({
                "targets": [f"{p['ip']}:{notes['prometheus.io/port']}"],
                "labels": {"job": f"apexrl/{p['deployment']}", "namespace": "apexrl", "pod": p["pod"],
                           "container": p["deployment"], "__metrics_path__": notes["prometheus.io/path"]},
            })  # fmt: skip
        tmp = self.work / "targets.json.tmp"
        tmp.write_text(json.dumps(groups))
        tmp.replace(self.work / "targets.json")
        return len(groups)

    def start_prometheus(self) -> None:
        port = free_port()
        config = {
            "global": {"scrape_interval": "5s", "evaluation_interval": "5s"},
            "scrape_configs": [{
                "job_name": "apexrl",
                "file_sd_configs": [{"files": [str(self.work / "targets.json")], "refresh_interval": "5s"}],
            }],
        }  # fmt: skip
        (self.work / "prometheus.yml").write_text(yaml.safe_dump(config))
        sh("promtool", "check", "config", str(self.work / "prometheus.yml"))
        log = open(self.work / "prometheus.log", "w")
        self.prometheus = subprocess.Popen(
            ["prometheus", f"--config.file={self.work / 'prometheus.yml'}",
             f"--storage.tsdb.path={self.work / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        self.prom_url = f"http://127.0.0.1:{port}"
        wait_for(lambda: self._ready(), 30, "Prometheus to be ready", interval=0.5)

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.prom_url + "/-/ready", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def query(self, expr: str) -> list[dict]:
        url = f"{self.prom_url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.load(r)
        assert body["status"] == "success", body
        return body["data"]["result"]

    def value(self, expr: str) -> float:
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else float("nan")

    # --- teardown ---------------------------------------------------------------------------
    def teardown(self) -> None:
        """Stops every pod within its terminationGracePeriodSeconds (podman's default stop
        timeout is 10 s), records exit codes, `kube down`s, removes volumes and the network."""
        if self.down:
            return
        self.down = True
        grace = {d["metadata"]["name"]: d["spec"]["template"]["spec"].get("terminationGracePeriodSeconds", 30)
                 for d in self.docs if d["kind"] == "Deployment"}  # fmt: skip
        t0 = time.monotonic()
        for name in reversed(ORDER):  # clients first, replay (final checkpoint) last
            pods = sorted({p["pod"] for p in self.pods() if p["deployment"] == name})
            if pods:
                sh(
                    "podman",
                    "pod",
                    "stop",
                    "-t",
                    str(grace[name]),
                    *pods,
                    check=False,
                    timeout=grace[name] + 60,
                )
            for p in self.pods():
                if p["deployment"] == name:
                    code = sh(
                        "podman",
                        "inspect",
                        p["name"],
                        "--format",
                        "{{.State.ExitCode}}",
                        check=False,
                    )
                    self.exit_codes[p["name"]] = (
                        code.strip(),
                        logs(p["name"], 3),
                    )
        self.timings["stop all pods"] = time.monotonic() - t0
        for name in reversed(ORDER):
            path = self.work / "play" / f"{name}.yaml"
            if path.exists():
                sh("podman", "kube", "down", str(path), check=False)
        if self.prometheus is not None and self.prometheus.poll() is None:
            self.prometheus.terminate()
            try:
                self.prometheus.wait(30)
            except subprocess.TimeoutExpired:
                self.prometheus.kill()
                self.prometheus.wait(10)
        # kube down leaves volumes (PVCs, the ConfigMap's, emptyDirs) and secrets behind.
        ours = {
            d["metadata"]["name"]
            for d in self.docs
            if d["kind"] in ("PersistentVolumeClaim", "ConfigMap")
        }
        for volume in set(sh("podman", "volume", "ls", "-q").split()) - self.volumes_before | ours:
            sh("podman", "volume", "rm", "-f", volume, check=False)
        for secret in sh("podman", "secret", "ls", "--format", "{{.Name}}", check=False).split():
            if secret in ours:
                sh("podman", "secret", "rm", secret, check=False)
        sh("podman", "network", "rm", "-f", NETWORK, check=False)
        self.timings["teardown"] = time.monotonic() - t0


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    t0 = time.monotonic()
    build = subprocess.run([str(ROOT / "deploy/podman/build_images.sh")], capture_output=True, text=True,
                           timeout=1500)  # fmt: skip
    assert build.returncode == 0, build.stdout + build.stderr
    print(build.stdout)
    build_seconds = time.monotonic() - t0
    rendered = sh("kubectl", "kustomize", str(OVERLAY))
    dep = Deployment(
        work=tmp_path_factory.mktemp("k8s"),
        docs=adapter.load([rendered]),
        volumes_before=set(sh("podman", "volume", "ls", "-q").split()),
    )
    dep.timings["build images"] = build_seconds
    # Every image the manifests name must resolve locally, as the manifest spells it.
    for d in dep.docs:
        if d["kind"] == "Deployment":
            for c in d["spec"]["template"]["spec"]["containers"]:
                assert sh("podman", "image", "exists", c["image"], check=False) == "", c["image"]
    sh("podman", "network", "rm", "-f", NETWORK, check=False)  # a leftover of a killed run
    try:
        sh("podman", "network", "create", NETWORK)
        t1 = time.monotonic()
        for name in ORDER:
            dep.play(name)
        dep.timings["kube play"] = time.monotonic() - t1
        dep.start_prometheus()
        dep.write_targets()
        yield dep
    finally:
        dep.teardown()
        print("timings (s):", {k: round(v, 1) for k, v in dep.timings.items()})
        print("exit codes:", {k: v[0] for k, v in dep.exit_codes.items()})


@pytest.mark.timeout(1800)
def test_trains_and_prometheus_scrapes_every_pod(deployment):
    dep = deployment
    t0 = time.monotonic()

    # Every pod up, with its metrics reachable by Prometheus.
    def all_up():
        dep.write_targets()
        up = dep.query("up")
        return len(up) == 4 and all(r["value"][1] == "1" for r in up)

    try:
        wait_for(all_up, 120, "up == 1 for replay, learner, evaluator, actor", interval=2)
        # Training: actors insert, replay samples, the learner updates and publishes.
        wait_for(
            lambda: dep.value("sum(apexrl_learner_updates_total)") > 0,
            180,
            "learner updates",
            interval=5,
        )
    except BaseException:
        print(dep.logs())
        raise
    time.sleep(max(0.0, TRAIN_SECONDS - (time.monotonic() - t0)))
    dep.timings["train"] = time.monotonic() - t0
    up = dep.query("up")
    assert sorted(r["metric"]["job"] for r in up) == [f"apexrl/{n}" for n in sorted(ORDER)]
    assert all(r["value"][1] == "1" for r in up), up
    assert dep.value("sum(apexrl_learner_updates_total)") > 0
    assert dep.value("sum(apexrl_replay_samples_total)") > 0
    assert dep.value("sum(apexrl_actor_transitions_inserted_total)") > 0
    assert all(p["state"] == "running" for p in dep.pods()), dep.logs()


@pytest.mark.timeout(600)
def test_scaling_actors_from_1_to_3_raises_env_steps_rate(deployment):
    dep = deployment
    rate = "sum(rate(apexrl_actor_env_steps_total[30s]))"

    def mean_rate(seconds: float) -> float:
        values = []
        for _ in range(int(seconds / 5)):
            values.append(dep.value(rate))
            time.sleep(5)
        return sum(values) / len(values)

    before = mean_rate(30)
    t0 = time.monotonic()
    # `kubectl scale deployment/actor --replicas=3`: the same manifest, replicas 3, replayed.
    dep.play("actor", replicas=3, replace=True)
    dep.timings["scale to 3 (kube play --replace)"] = time.monotonic() - t0

    def three_up():
        dep.write_targets()
        return len([r for r in dep.query('up{job="apexrl/actor"} == 1')]) == 3

    wait_for(three_up, 120, "3 actor targets up", interval=2)
    # Past the restart of actor 0 and the new actors' start: a full 30 s window of 3 actors.
    wait_for(lambda: dep.value('count(rate(apexrl_actor_env_steps_total[30s]) > 0)') == 3, 120,
             "3 actors stepping", interval=5)  # fmt: skip
    time.sleep(30)
    after = mean_rate(30)
    dep.timings["env steps/s 1 actor"] = before
    dep.timings["env steps/s 3 actors"] = after
    print(f"env steps/s: 1 actor {before:.0f}, 3 actors {after:.0f}")
    # Not 3x: this kind of machine has 2 cores, shared with the learner, replay and the
    # evaluator (measured here: ~7100 -> ~9200 steps/s). Each actor is limited to 1 CPU.
    assert after > 1.15 * before, (before, after)


def alert_rules() -> list[dict]:
    rule = yaml.safe_load((ROOT / "deploy/k8s/monitoring/prometheusrule.yaml").read_text())
    return rule["spec"]["groups"]


# Alerts that need what only a real cluster has (cAdvisor via the kubelet, kube-state-metrics).
NEEDS_CLUSTER: dict[str, str] = {}  # every alert reads apexrl's own metrics: all are checked


def condition_operand(expr: str) -> str:
    """`A == 0` / `A > 100` -> A: the series the alert compares, which must exist."""
    match = re.match(r"(?s)^(.*?)\s*(==|!=|>=|<=|>|<)\s*[-+0-9.eE]+\s*$", expr.strip())
    return match.group(1) if match else expr


@pytest.mark.timeout(300)
def test_alert_rules_check_and_every_expression_has_data(deployment, tmp_path):
    dep = deployment
    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump({"groups": alert_rules()}))
    sh("promtool", "check", "rules", str(rules))
    missing = []
    for group in alert_rules():
        for rule in group["rules"]:
            # The whole expression must run on the real server (empty: not firing) ...
            sh("promtool", "query", "instant", dep.prom_url, rule["expr"])
            if rule["alert"] in NEEDS_CLUSTER:
                print(
                    f"{rule['alert']}: not checked for data, needs {NEEDS_CLUSTER[rule['alert']]}"
                )
                continue
            # ... and what it compares must return data from the running pods.
            shown = sh(
                "promtool", "query", "instant", dep.prom_url, condition_operand(rule["expr"])
            )
            if not shown.strip():
                missing.append(rule["alert"])
    assert not missing, f"alert expressions without data: {missing}"


@pytest.mark.timeout(300)
def test_every_dashboard_query_returns_data(deployment):
    dashboard = ROOT / "deploy/grafana/dashboard.py"
    if not dashboard.exists():
        pytest.skip("no deploy/grafana/dashboard.py yet")
    spec = importlib.util.spec_from_file_location("apexrl_dashboard", dashboard)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "panel_queries"):
        pytest.skip("deploy/grafana/dashboard.py has no panel_queries()")
    empty = []
    for query in module.panel_queries():
        expr = query if isinstance(query, str) else query[-1]
        expr = re.sub(
            r"\$__(rate_interval|interval|range)|\$\{__(rate_interval|interval|range)\}", "1m", expr
        )
        if not deployment.query(expr):
            empty.append(expr)
    assert not empty, f"dashboard queries without data: {empty}"


@pytest.mark.timeout(600)
def test_pods_stop_cleanly_and_nothing_is_left(deployment):
    dep = deployment
    dep.teardown()
    print("exit codes:", {k: v[0] for k, v in dep.exit_codes.items()})
    assert dep.exit_codes and all(code == "0" for code, _ in dep.exit_codes.values()), (
        dep.exit_codes
    )
    assert all("stopped" in log for _, log in dep.exit_codes.values()), dep.exit_codes
    left = [c for c in json.loads(sh("podman", "ps", "-a", "--pod", "--format", "json") or "[]")
            if c["Id"] in dep.containers or (c.get("PodName") or "").rsplit("-pod-", 1)[0] in ORDER]  # fmt: skip
    assert not left, left
    assert not [
        p for p in sh("podman", "pod", "ps", "-q", "--filter", f"network={NETWORK}").split()
    ]
    assert set(sh("podman", "volume", "ls", "-q").split()) <= dep.volumes_before
    assert sh("podman", "network", "exists", NETWORK, check=False) == "" and subprocess.run(
        ["podman", "network", "exists", NETWORK]).returncode != 0  # fmt: skip
    mounts = Path("/proc/mounts").read_text()
    assert not [cid for cid in dep.containers if cid in mounts or cid[:12] in mounts]
    assert dep.prometheus is not None and dep.prometheus.poll() is not None
