"""The Kubernetes deployment for real, without Kubernetes: the images built from
deploy/Dockerfile with podman, the cpu-only overlay's manifests run with `podman kube play`
(through the test-only deploy/podman/adapter.py), a real Prometheus scraping every pod.

What it checks, in file order on one deployment (module fixture): every probe the manifests
declare passes when run by hand against its pod, and the replay shard replay-0 is shard 0 by
its host name; Prometheus scrapes every pod; it trains (every actor acts with parameters
newer than the first and at most a bounded number of versions behind, the replay grows, the
learner's update count advances); scaled from 1 to 3 actors, all 3 step and the epsilon
ladder is re-spread over 3; scaled from 1 replay shard to 2, the new shard (empty) takes
inserts and is sampled, scaled back to 1 it writes its checkpoint and its volume stays while
training goes on with shard 0, scaled to 2 again it restores its items from that volume and
is sampled again; every alert expression and dashboard query has data; the autoscaling query
has a value from the pods, and, rolled out again with a samples_per_insert ratio in the
ConfigMap, rises above its scale-up threshold with one slow actor and falls below its
scale-down threshold with three free ones; every pod stops with exit code 0 and nothing is left.

What podman does not run, so this test does NOT show it works (see the adapter's docstring):
- Probes: the adapter removes every startup, readiness and liveness probe (podman never runs
  readiness or startup probes, has no gRPC probe, and named probe ports resolve through the
  containerPorts it also removes). The test sends each probe's request itself, once the pod
  runs, and requires a pass within the probe's failureThreshold x periodSeconds; nothing
  restarts a pod on a failing liveness probe or holds traffic back on a failing readiness probe.
- Services: not created. Each Service's name is a network alias of its pods (round-robin DNS
  in the podman network): no ClusterIP, no port mapping, no targetPort by name. For replay's
  headless Service that is what Kubernetes does too (the name resolves to every shard's pod),
  except that podman resolves a pod as soon as it runs, not once it is ready.
- StatefulSets: podman does not run them. The adapter makes each ordinal the Pod the
  controller would (replay-0, host name replay-0, its own volume checkpoints-replay-0, kept
  when the pod goes); the test scales by playing or `kube down`ing the highest ordinal. No
  controller: nothing recreates a deleted pod, and a rolling update is not run here.
- NetworkPolicies (also ServiceAccounts, PodDisruptionBudgets, the Namespace and its Pod
  Security labels): not created, so not enforced; every pod reaches every other pod and the
  host.
- Replicas: the manifest runs 4 actors; the test runs 1, then 3 (2 shared cores), so the ladder
  over 4 is not run here. No scheduler: requests place nothing (limits are enforced).

Needs root, podman (configured as .ci/run configures it), debootstrap, prometheus and
promtool, kubectl: skipped when one is missing (CI sets APEXRL_REQUIRE_PODMAN=1: a failure).
"""

from __future__ import annotations

import collections
import functools
import importlib.util
import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import tomllib
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.conftest import Throttle, metrics, wait_for

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
NETWORK = "apexrl-e2e"
OVERLAY = ROOT / "deploy/kustomize/overlays/cpu-only"
ORDER = ["replay", "learner", "relay", "evaluator", "actor"]  # servers first, like a rollout
PROBES = ("startupProbe", "readinessProbe", "livenessProbe")
# An actor asks for parameters every pull_interval env steps and the learner publishes every
# publish_interval updates, so an actor's parameter lag (versions published between its last
# two pulls) is about updates_per_env_step * pull_interval / publish_interval, plus one
# published during the pull. The CPU learner here makes 0.0003 to 0.013 updates per env step
# of one actor (the trains test prints it); the bound allows 0.1: 5 versions with the
# manifests' pull_interval 400 and publish_interval 10. (A new actor's first pull reports
# the learner's whole version as lag; its next pull, 400 env steps later, the real one.)
UPDATES_PER_ENV_STEP_LIMIT = 0.1
# eps_i = 0.4 ** (1 + 7 i / (N - 1)) (Ape-X), over N = 3 actors.
LADDER_OF_3 = {0: 0.4, 1: 0.4**4.5, 2: 0.4**8}
# The window of each printed env steps/s figure (a figure, not a check: 2 shared cores).
FIGURE_SECONDS = 15.0
# deploy/podman/build_images.sh: five images, rebuilt when the sources change.
BUILD_SECONDS = 1500
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


def probe_passes(ip: str, container: dict, probe: dict) -> bool:
    """One try of a probe, as the kubelet sends it to the pod (timeoutSeconds, default 1 s)."""
    timeout = probe.get("timeoutSeconds", 1)
    if "grpc" in probe:  # the standard health protocol; service "" is the whole server
        request = health_pb2.HealthCheckRequest(service=probe["grpc"].get("service", ""))
        with grpc.insecure_channel(f"{ip}:{probe['grpc']['port']}") as channel:
            try:
                reply = health_pb2_grpc.HealthStub(channel).Check(request, timeout=timeout)
            except grpc.RpcError:
                return False
        return reply.status == health_pb2.HealthCheckResponse.SERVING
    if "httpGet" in probe:
        get, port = probe["httpGet"], probe["httpGet"]["port"]
        if isinstance(port, str):  # named: the manifest's containerPorts (the adapter drops them)
            port = next(p["containerPort"] for p in container["ports"] if p.get("name") == port)
        url = f"{get.get('scheme', 'HTTP').lower()}://{ip}:{port}{get.get('path', '/')}"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response:
                return 200 <= response.status < 400
        except OSError:  # refused, timed out, or an HTTP error status
            return False
    raise AssertionError(f"no way to run this probe here: {probe}")


@dataclass
class Deployment:
    work: Path
    docs: list[dict]
    volumes_before: set[str]
    replicas: dict = field(default_factory=dict)  # workload -> pods played
    files: dict = field(default_factory=dict)  # play unit -> {"file", "aliases", "workload"}
    played: dict = field(default_factory=dict)  # play unit -> its file, while played
    containers: set[str] = field(default_factory=set)  # every container id ever seen
    prometheus: subprocess.Popen | None = None
    prom_url: str = ""
    timings: dict = field(default_factory=dict)
    marks: dict = field(default_factory=dict)  # name -> an env_steps() reading
    exit_codes: dict = field(default_factory=dict)
    down: bool = False

    @property
    def templates(self) -> dict[str, dict]:
        """Workload name -> its pod template, as rendered (probes and ports included)."""
        return {d["metadata"]["name"]: d["spec"]["template"] for d in self.docs
                if d["kind"] in adapter.WORKLOAD_KINDS}  # fmt: skip

    @property
    def settings(self) -> dict:
        """The apexrl.toml every pod reads, from the rendered ConfigMap."""
        config = next(d for d in self.docs if d["kind"] == "ConfigMap")
        return tomllib.loads(config["data"]["apexrl.toml"])

    # --- podman ---------------------------------------------------------------------------
    def play(self, name: str, replicas: int | None = None, replace: bool = False) -> None:
        """`kube play`s one workload at `replicas`. A Deployment: replace `kube down`s what was
        played of it first (podman 4.3's `kube play --replace` fails on a Deployment: "pod
        already exists"). A StatefulSet, as its controller scales: pods beyond `replicas`
        stop (highest ordinal first, within their grace period) and go, their volumes stay;
        missing ordinals are played."""
        if replicas:
            self.replicas[name] = replicas
        units = adapter.workloads(self.docs, self.replicas)
        wanted = [unit for unit, info in units.items() if info["workload"] == name]
        mine = [unit for unit in self.played if adapter.workload_of(unit) == name]
        # Down with the files they were played from, before those are rewritten.
        for unit in sorted((u for u in mine if u not in wanted or replace), reverse=True):
            if unit != name:  # a StatefulSet's pod: stopped as the kubelet would
                self.stop_pods([unit], name)
            sh("podman", "kube", "down", self.played.pop(unit))
        self.files = adapter.write(self.work / "play", self.docs, self.replicas)
        for unit in wanted:
            if unit not in self.played:
                info = self.files[unit]
                network = adapter.network_option(NETWORK, info["aliases"])
                sh("podman", "kube", "play", "--network", network, info["file"])
                self.played[unit] = info["file"]

    def stop_pods(self, pods: list[str], workload: str) -> None:
        """`podman pod stop` within the workload's terminationGracePeriodSeconds (podman's
        default stop timeout is 10 s); records each container's exit code and last lines."""
        grace = self.templates[workload]["spec"].get("terminationGracePeriodSeconds", 30)
        sh("podman", "pod", "stop", "-t", str(grace), *pods, check=False, timeout=grace + 60)
        for p in self.pods():
            if p["pod"] in pods:
                code = sh("podman", "inspect", p["name"], "--format", "{{.State.ExitCode}}",
                          check=False)  # fmt: skip
                self.exit_codes[p["name"]] = (code.strip(), logs(p["name"], 3))

    def pods(self) -> list[dict]:
        """Our pods' app containers: name, pod, deployment (its workload), ip, id, state."""
        out = []
        for c in json.loads(sh("podman", "ps", "-a", "--pod", "--format", "json") or "[]"):
            pod = c.get("PodName") or ""
            deployment = adapter.workload_of(pod)
            if deployment not in ORDER or c.get("IsInfra"):
                continue
            self.containers.add(c["Id"])
            name = c["Names"][0]
            ip = sh("podman", "inspect", name, "--format",
                    "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}").strip()  # fmt: skip
            out.append(dict(name=name, pod=pod, deployment=deployment, ip=ip, id=c["Id"],
                            state=c["State"]))  # fmt: skip
        return out

    def running(self, deployment: str | None = None) -> list[dict]:
        return [p for p in self.pods() if p["state"] == "running" and p["ip"]
                and deployment in (None, p["deployment"])]  # fmt: skip

    def logs(self) -> str:
        return "\n".join(
            f"--- {p['name']} ({p['state']})\n" + logs(p["name"], 30) for p in self.pods()
        )

    def metrics_port(self, pod: dict) -> int:
        return int(
            self.templates[pod["deployment"]]["metadata"]["annotations"]["prometheus.io/port"]
        )

    def metrics(self, pod: dict) -> dict[str, float]:
        """The pod's own /metrics, read directly (not through Prometheus)."""
        return metrics(self.metrics_port(pod), host=pod["ip"])

    def check_probes(self, pods: list[dict]) -> dict[str, list[str]]:
        """Runs every probe the manifests give each pod's container, against the pod; each must
        pass before the kubelet would act on it (failureThreshold x periodSeconds).
        Returns pod -> the probes that passed."""
        passed: dict[str, list[str]] = {}
        for p in pods:
            for container in self.templates[p["deployment"]]["spec"]["containers"]:
                if p["name"] != f"{p['pod']}-{container['name']}":
                    continue
                for kind in PROBES:
                    if probe := container.get(kind):
                        budget = probe.get("failureThreshold", 3) * probe.get("periodSeconds", 10)
                        how = "grpc" if "grpc" in probe else "httpGet"
                        wait_for(functools.partial(probe_passes, p["ip"], container, probe), budget,
                                 f"{p['name']}'s {kind} ({how} {probe[how]}) to pass",
                                 interval=1)  # fmt: skip
                        passed.setdefault(p["pod"], []).append(f"{kind} {how}")
        return passed

    def env_steps(self) -> tuple[float, float]:
        """(now, env steps of every running actor), from the actors' own counters."""
        total = sum(self.metrics(p)["apexrl_actor_env_steps_total"] for p in self.running("actor"))
        return time.monotonic(), total

    def env_steps_per_second(self, since: tuple[float, float] | None) -> tuple[float, float]:
        """(env steps/s of every running actor since `since`, an env_steps() reading, and the
        window's seconds), the window made up to FIGURE_SECONDS: a figure, not a check."""
        since = since or self.env_steps()
        time.sleep(max(0.0, FIGURE_SECONDS - (time.monotonic() - since[0])))  # the window
        now, steps = self.env_steps()
        return (steps - since[1]) / (now - since[0]), now - since[0]

    # --- Prometheus -------------------------------------------------------------------------
    def write_targets(self) -> int:
        """file_sd targets as the prometheus.io/* annotations describe each running pod."""
        groups = []
        for p in self.running():
            notes = self.templates[p["deployment"]]["metadata"]["annotations"]
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

    def scrapes_every_pod(self) -> bool:
        """Every pod played runs and Prometheus scrapes it: up == 1 for its address, holding the
        process start time the pod itself reports (not a replaced pod's from the same address)."""
        self.write_targets()
        pods = self.running()
        if collections.Counter(p["deployment"] for p in pods) != self.replicas:
            return False
        up = {r["metric"]["instance"]: r["value"][1] for r in self.query("up")}
        started = {r["metric"]["instance"]: float(r["value"][1])
                   for r in self.query("process_start_time_seconds")}  # fmt: skip
        for p in pods:
            instance = f"{p['ip']}:{self.metrics_port(p)}"
            try:
                own = self.metrics(p)["process_start_time_seconds"]
            except OSError:  # not serving /metrics yet
                return False
            if up.get(instance) != "1" or not math.isclose(started.get(instance, 0), own):
                return False
        return True

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

    # --- teardown ---------------------------------------------------------------------------
    def teardown(self) -> None:
        """Stops every pod within its terminationGracePeriodSeconds (podman's default stop
        timeout is 10 s), records exit codes, `kube down`s, removes volumes and the network."""
        if self.down:
            return
        self.down = True
        t0 = time.monotonic()
        for name in reversed(ORDER):  # clients first, replay (final checkpoint) last
            t_stop = time.monotonic()
            pods = sorted({p["pod"] for p in self.pods() if p["deployment"] == name})
            if pods:
                self.stop_pods(pods, name)
            self.timings[f"stop {name}"] = time.monotonic() - t_stop
        self.timings["stop all pods"] = time.monotonic() - t0
        for unit in sorted(self.played, key=lambda u: ORDER.index(adapter.workload_of(u))):
            sh("podman", "kube", "down", self.played.pop(unit), check=False)
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
                           timeout=BUILD_SECONDS)  # fmt: skip
    assert build.returncode == 0, build.stdout + build.stderr
    print(build.stdout)
    build_seconds = time.monotonic() - t0
    rendered = sh("kubectl", "kustomize", str(OVERLAY))
    docs = adapter.load([rendered])
    # As the manifests say, except 1 actor to start with (their 4 would share 2 cores).
    replicas = {d["metadata"]["name"]: d["spec"].get("replicas", 1) for d in docs
                if d["kind"] in adapter.WORKLOAD_KINDS} | {"actor": 1}  # fmt: skip
    dep = Deployment(
        work=tmp_path_factory.mktemp("k8s"),
        docs=docs,
        volumes_before=set(sh("podman", "volume", "ls", "-q").split()),
        replicas=replicas,
    )
    dep.timings["build images"] = build_seconds
    # Every image the manifests name must resolve locally, as the manifest spells it.
    for template in dep.templates.values():
        for c in template["spec"]["containers"]:
            assert sh("podman", "image", "exists", c["image"], check=False) == "", c["image"]
    sh("podman", "network", "rm", "-f", NETWORK, check=False)  # a leftover of a killed run
    try:
        sh("podman", "network", "create", NETWORK)
        t1 = time.monotonic()
        for name in ORDER:
            dep.play(name)
        dep.timings["kube play"] = time.monotonic() - t1
        dep.start_prometheus()
        try:
            wait_for(dep.scrapes_every_pod, 120, "every pod running, scraped by Prometheus", 1)
        except BaseException:
            print(dep.logs())
            raise
        dep.timings["play to every pod scraped"] = time.monotonic() - t1
        yield dep
    finally:
        dep.teardown()
        print("timings (s):", {k: round(v, 1) for k, v in dep.timings.items()})
        print("exit codes:", {k: v[0] for k, v in dep.exit_codes.items()})


# The first test's time includes the module fixture's: image builds (up to BUILD_SECONDS, on
# a loaded machine most of it when the sources changed) and the first rollout.
@pytest.mark.timeout(BUILD_SECONDS + 600)
def test_every_probe_passes_and_prometheus_scrapes_every_pod(deployment):
    dep = deployment
    up = dep.query("up")
    assert sorted(r["metric"]["job"] for r in up) == [f"apexrl/{n}" for n in sorted(ORDER)]
    assert all(r["value"][1] == "1" for r in up), up
    passed = dep.check_probes(dep.running())
    print("probes passed, run against the pods:", passed)
    assert sorted(passed) == sorted(p["pod"] for p in dep.running()), passed
    # --shard=hostname: each replay pod is the shard its StatefulSet ordinal names.
    shards = {p["pod"]: dep.metrics(p)["apexrl_replay_shard"] for p in dep.running("replay")}
    assert shards == {f"replay-{i}": i for i in range(dep.replicas["replay"])}, shards


def lag_bound(settings: dict) -> float:
    """The most versions an actor may be behind at its last pull (UPDATES_PER_ENV_STEP_LIMIT)."""
    pulls, publishes = settings["actor"]["pull_interval"], settings["learner"]["publish_interval"]
    return 1 + UPDATES_PER_ENV_STEP_LIMIT * pulls / publishes


@pytest.mark.timeout(600)
def test_it_trains_every_actor_acting_with_fresh_parameters(deployment):
    dep = deployment
    bound = lag_bound(dep.settings)
    pods = dep.running()
    replay, learner = (next(p for p in pods if p["deployment"] == d) for d in ("replay", "learner"))
    actors = {p["pod"]: p for p in pods if p["deployment"] == "actor"}

    def observe() -> dict:
        return {
            "replay size": dep.metrics(replay)["apexrl_replay_size"],
            "updates": dep.metrics(learner)["apexrl_learner_updates_total"],
            **{pod: dep.metrics(p) for pod, p in actors.items()},
        }

    first, last = observe(), {}
    version, lag = "apexrl_actor_parameter_version", "apexrl_actor_parameter_lag"

    def trains() -> bool:
        last.update(observe())
        return (
            last["replay size"] > first["replay size"]
            and last["updates"] > first["updates"]
            and all(
                last[pod][version] > max(1, first[pod][version]) and last[pod][lag] <= bound
                for pod in actors
            )
        )

    try:
        # The actor fills replay; from min_size_to_sample on the learner trains and publishes.
        wait_for(trains, 180, "replay to grow, updates to advance, every actor to hold a new "
                 f"parameter version > 1 at most {bound:.0f} behind", interval=0.5)  # fmt: skip
    except BaseException:
        print("first:", first, "\nlast:", last)
        print(dep.logs())
        raise
    dep.marks["1 actor"] = dep.env_steps()
    steps = "apexrl_actor_env_steps_total"
    fewest = min(last[pod][steps] - first[pod][steps] for pod in actors)
    each = ", ".join(f"{pod} version {first[pod][version]:.0f} -> {last[pod][version]:.0f} "
                     f"lag {last[pod][lag]:.0f}" for pod in actors)  # fmt: skip
    print(f"trains: replay size {first['replay size']:.0f} -> {last['replay size']:.0f}, "
          f"updates {first['updates']:.0f} -> {last['updates']:.0f}, {each} (lag bound "
          f"{bound:.0f}); {(last['updates'] - first['updates']) / max(fewest, 1):.4f} updates "
          "per env step of one actor")  # fmt: skip


@pytest.mark.timeout(600)
def test_scaling_actors_from_1_to_3_steps_all_on_the_ladder_of_3(deployment):
    dep = deployment
    bound = lag_bound(dep.settings)
    before, before_seconds = dep.env_steps_per_second(dep.marks.get("1 actor"))
    t0 = time.monotonic()
    # `kubectl scale deployment/actor --replicas=3`: the same manifest, replicas 3, replayed.
    dep.play("actor", replicas=3, replace=True)
    dep.timings["scale to 3 (kube play --replace)"] = time.monotonic() - t0

    first: dict[str, float] = {}  # container id -> its env steps when first read
    seen: dict = {}

    def three_step_on_the_ladder() -> bool:
        try:
            now = {p["id"]: dep.metrics(p) for p in dep.running("actor")}
        except OSError:  # a new actor not serving /metrics yet
            return False
        seen.clear()
        seen.update(now)
        for cid, m in now.items():
            first.setdefault(cid, m["apexrl_actor_env_steps_total"])
        places = sorted(m["apexrl_actor_ladder_index"] for m in now.values())
        return places == [0, 1, 2] and all(
            m["apexrl_actor_env_steps_total"] > first[cid]
            and math.isclose(
                m["apexrl_actor_epsilon"], LADDER_OF_3[int(m["apexrl_actor_ladder_index"])]
            )
            and m["apexrl_actor_parameter_version"] > 1
            and m["apexrl_actor_parameter_lag"] <= bound
            for cid, m in now.items()
        )

    try:
        # The replaced actor's lease runs out lease_seconds after its last pull; until then
        # the new ones share a ladder of 4 with it.
        wait_for(three_step_on_the_ladder, 120, "3 actors stepping, on places 0, 1, 2 with "
                 f"epsilons {LADDER_OF_3}, with parameters > 1 at most {bound:.0f} behind",
                 interval=0.5)  # fmt: skip
        mark = dep.env_steps()
        dep.timings["scale to 3: all 3 on the ladder"] = time.monotonic() - t0
        wait_for(dep.scrapes_every_pod, 120, "Prometheus scraping the 3 actors", interval=1)
        passed = dep.check_probes(dep.running("actor"))
        assert len(passed) == 3, passed
    except BaseException:
        print("actors:", {cid[:12]: {k: v for k, v in m.items() if k.startswith("apexrl_actor_")}
                          for cid, m in seen.items()})  # fmt: skip
        print(dep.logs())
        raise
    dep.timings["scale to 3: Prometheus scrapes them, probes pass"] = time.monotonic() - t0
    ladder = {int(m["apexrl_actor_ladder_index"]): m["apexrl_actor_epsilon"] for m in seen.values()}
    print("ladder of 3 (place: epsilon):", dict(sorted(ladder.items())))
    after, after_seconds = dep.env_steps_per_second(mark)
    # Not 3x, and no check: this kind of machine has 2 cores, shared with the learner, replay,
    # the evaluator and whatever else runs; each actor is limited to 1 CPU.
    print(f"env steps/s: 1 actor {before:.0f} (over {before_seconds:.0f} s), 3 actors "
          f"{after:.0f} (over {after_seconds:.0f} s): ratio {after / before:.2f}")  # fmt: skip
    dep.timings["env steps/s 1 actor"] = before
    dep.timings["env steps/s 3 actors"] = after


def restored_items(log: str) -> int | None:
    """Items a replay restored at start, from its log (None: it started empty)."""
    match = re.search(r"restored table 'default' from \S+: (\d+) items", log)
    return int(match[1]) if match else None


@pytest.mark.timeout(600)
def test_scaling_replay_shards_keeps_each_shards_items(deployment):
    """`kubectl scale statefulset/replay --replicas=2`, then 1, then 2 again. Added, shard 1
    starts empty, takes its share of the inserts and is sampled once it holds
    min_size_to_sample. Removed, it checkpoints on SIGTERM and its volume stays; training goes
    on with shard 0. Added again, it restores every item it held from that volume."""
    dep = deployment
    (table,) = [t for t in dep.settings["replay"]["tables"] if t["name"] == "default"]
    minimum = table["min_size_to_sample"]
    seen: dict = {}

    def observe() -> dict[str, dict[str, float]]:
        now = {p["pod"]: dep.metrics(p) for p in dep.running("replay")}
        now["learner"] = dep.metrics(dep.running("learner")[0])
        seen.clear()
        seen.update(now)
        return now

    def serving(*pods: str) -> dict | None:
        """observe(), once every running pod and `pods` serve /metrics."""
        try:
            now = observe()
        except OSError:  # a pod not serving /metrics yet
            return None
        return now if set(pods) <= set(now) else None

    def grows(before: dict, shard: str) -> Callable[[], bool]:
        """shard takes inserts and is sampled, the learner updates, since `before`."""

        def check() -> bool:
            now = serving(shard)
            return (
                now is not None
                and now[shard]["apexrl_replay_size"] >= minimum
                and now[shard]["apexrl_replay_inserts_total"]
                > before.get(shard, {}).get("apexrl_replay_inserts_total", 0)
                and now[shard]["apexrl_replay_samples_total"]
                > before.get(shard, {}).get("apexrl_replay_samples_total", 0)
                and now["learner"]["apexrl_learner_updates_total"]
                > before["learner"]["apexrl_learner_updates_total"]
            )

        return check

    t0 = time.monotonic()
    try:
        # Added: an empty shard 1 joins through the Service name (actors and the learner
        # re-resolve it), takes inserts and is sampled; shard 0 keeps going.
        before = observe()
        assert set(before) == {"replay-0", "learner"}, set(before)
        dep.play("replay", replicas=2)
        wait_for(grows(before, "replay-1"), 180, "shard replay-1 to hold min_size_to_sample, "
                 "take inserts, be sampled, and the learner to update", interval=1)  # fmt: skip
        assert restored_items(logs("replay-1-replay", 1000)) is None, "a new shard starts empty"
        assert seen["replay-1"]["apexrl_replay_shard"] == 1
        wait_for(grows(before, "replay-0"), 60, "shard replay-0 to go on too", interval=1)
        wait_for(dep.scrapes_every_pod, 120, "Prometheus scraping both shards", interval=1)
        dep.timings["shards 1 -> 2: both take inserts and are sampled"] = time.monotonic() - t0

        # Removed: shard 1 checkpoints on SIGTERM and exits 0; its volume stays. Its items are
        # not sampled until it is back (the learner drops the priority updates of its keys).
        now = wait_for(lambda: serving("replay-1"), 30, "replay-1's /metrics", interval=1)
        held = now["replay-1"]["apexrl_replay_size"]  # its final checkpoint holds at least this
        t1 = time.monotonic()
        dep.play("replay", replicas=1)
        code, last_lines = dep.exit_codes["replay-1-replay"]
        assert code == "0", last_lines
        assert "checkpoints-replay-1" in sh("podman", "volume", "ls", "-q").split()
        before = observe()
        assert set(before) == {"replay-0", "learner"}, set(before)
        wait_for(grows(before, "replay-0"), 120, "training to go on with shard 0 alone",
                 interval=1)  # fmt: skip
        dep.timings["shards 2 -> 1: training goes on"] = time.monotonic() - t1

        # Added again: shard 1 restores what it held from its volume and rejoins.
        t2 = time.monotonic()
        dep.play("replay", replicas=2)
        wait_for(lambda: restored_items(logs("replay-1-replay", 1000)) is not None, 120,
                 "replay-1 to restore its checkpoint", interval=1)  # fmt: skip
        restored = restored_items(logs("replay-1-replay", 1000))
        assert restored >= held, f"restored {restored} items, held {held} before it stopped"
        before = wait_for(lambda: serving("replay-1"), 60, "replay-1 to serve /metrics again",
                          interval=1)  # fmt: skip
        assert before["replay-1"]["apexrl_replay_size"] >= restored
        wait_for(grows(before, "replay-1"), 180, "the restored shard to take inserts and "
                 "be sampled again", interval=1)  # fmt: skip
        wait_for(dep.scrapes_every_pod, 120, "Prometheus scraping both shards", interval=1)
        dep.timings["shards 1 -> 2 again: restored and sampled"] = time.monotonic() - t2
    except BaseException:
        ours = ("apexrl_replay_", "apexrl_learner_")
        for pod, values in seen.items():
            print(pod, {k: v for k, v in values.items() if k.startswith(ours)})
        print(dep.logs())
        raise
    sizes = {pod: m["apexrl_replay_size"] for pod, m in seen.items() if pod != "learner"}
    print(
        f"shards: replay-1 held {held:.0f} items when scaled away, restored {restored}; "
        f"sizes now {sizes}"
    )


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
    exprs = [
        re.sub(
            r"\$__(rate_interval|interval|range)|\$\{__(rate_interval|interval|range)\}",
            "1m",
            query if isinstance(query, str) else query[-1],
        )
        for query in module.panel_queries()
    ]
    empty = [expr for expr in exprs if not deployment.query(expr)]
    assert not empty, f"dashboard queries without data: {empty}"


@pytest.mark.timeout(120)
def test_the_autoscaling_query_reads_the_scraped_pods(deployment):
    """The actor demand ratio of deploy/k8s/autoscaling, the query KEDA (and, through the
    adapter, the HPA) sends, has one value from these pods' series. The overlay runs Ape-X's
    table without a samples_per_insert ratio, so no insert is ever held and the ratio is at
    least 1 (the next test rolls out a ratio and drives it into both states)."""
    dep = deployment
    (table,) = [t for t in dep.settings["replay"]["tables"] if t["name"] == "default"]
    assert table["samples_per_insert"] == 0
    scaled = yaml.safe_load((ROOT / "deploy/k8s/autoscaling/keda-scaledobject.yaml").read_text())
    (trigger,) = scaled["spec"]["triggers"]
    for series in ("apexrl_learner_prefetch_wait_seconds_total", "apexrl_actor_env_steps_total"):
        assert dep.query(f'{series}{{namespace="apexrl"}}'), f"no {series} from the pods"
    result = dep.query(trigger["metadata"]["query"])
    assert len(result) == 1, result
    ratio = float(result[0]["value"][1])
    print(f"actor demand ratio on the running deployment: {ratio:.3f}")
    assert ratio >= 1.0


# The HPA's tolerance around the target 1 (tests/deploy/test_autoscaling.py).
SCALE_UP_ABOVE, SCALE_DOWN_BELOW = 1.1, 0.9
# What a user sets to let the replay hold inserts (docs/deployment.md: "Too many" needs it).
# One sample per inserted item: the learner's demand (batch_size 256 an update) outruns one
# slow actor and is outrun by three free ones, however fast the shared cores let it train.
RATIO = {"samples_per_insert": "1.0", "error_buffer": "1024.0"}
WINDOW = "20s"  # the query's [2m] windows, shortened so that each state shows within a minute


def with_ratio(toml: str) -> str:
    """The ConfigMap's apexrl.toml with RATIO in its one replay table."""
    for key, value in RATIO.items():
        toml, n = re.subn(rf"(?m)^(\s*){key} = 0\.0$", rf"\g<1>{key} = {value}", toml)
        assert n == 1, f"{key} not found once in the ConfigMap"
    return toml


def roll_out_again(dep: Deployment, replicas: dict[str, int]) -> None:
    """Every workload stopped (clients first) and played again from dep.docs, as after a
    ConfigMap change and a restart of every workload; the replay shards start empty."""
    for name in reversed(ORDER):
        pods = sorted({p["pod"] for p in dep.pods() if p["deployment"] == name})
        if pods:
            dep.stop_pods(pods, name)
        for unit in sorted((u for u in dep.played if adapter.workload_of(u) == name), reverse=True):
            sh("podman", "kube", "down", dep.played.pop(unit))
    for volume in set(sh("podman", "volume", "ls", "-q").split()) - dep.volumes_before:
        sh("podman", "volume", "rm", "-f", volume)  # ConfigMap, claims: kube play makes them anew
    dep.replicas |= replicas
    for name in ORDER:
        dep.play(name)
    wait_for(dep.scrapes_every_pod, 180, "every pod running again, scraped by Prometheus", 1)


@pytest.mark.timeout(900)
def test_the_autoscaling_query_tells_too_few_actors_from_too_many(deployment):
    """The shipped query, evaluated by the Prometheus scraping the pods, in both states the
    autoscalers act on. The overlay's table holds no insert (samples_per_insert 0), so the
    deployment rolls out again as a user enabling the ratio would (RATIO in the ConfigMap,
    every workload restarted, its volumes new; one shard): one actor stopped 98% of the time
    leaves the learner waiting for data (the ratio must rise above the scale-up threshold),
    then three free actors are held by the replay's rate limiter (below the scale-down
    threshold)."""
    dep = deployment
    config = next(d for d in dep.docs if d["kind"] == "ConfigMap")
    config["data"]["apexrl.toml"] = with_ratio(config["data"]["apexrl.toml"])
    roll_out_again(dep, {"replay": 1, "actor": 1})
    assert {k: dep.settings["replay"]["tables"][0][k] for k in RATIO} == {
        k: float(v) for k, v in RATIO.items()
    }
    scaled = yaml.safe_load((ROOT / "deploy/k8s/autoscaling/keda-scaledobject.yaml").read_text())
    (trigger,) = scaled["spec"]["triggers"]
    query = trigger["metadata"]["query"]
    assert query.count("[2m]") == 2, query
    query = query.replace("[2m]", f"[{WINDOW}]")
    (learner,) = dep.running("learner")
    seen: list[float] = []

    def ratio(predicate) -> bool:
        result = dep.query(query)
        seen.extend(float(r["value"][1]) for r in result)
        return len(result) == 1 and predicate(seen[-1])

    (actor,) = dep.running("actor")
    pid = int(sh("podman", "inspect", actor["name"], "--format", "{{.State.Pid}}"))
    throttle = Throttle(pid, period=1.0, stopped=0.98)
    try:
        wait_for(lambda: dep.metrics(learner)["apexrl_learner_updates_total"] > 0, 180,
                 "the learner's first update", interval=1)  # fmt: skip
        steady = time.monotonic() + 2 * 20  # a full window after the first batch's wait
        wait_for(lambda: ratio(lambda r: r > SCALE_UP_ABOVE) and time.monotonic() > steady,
                 180, f"the ratio above {SCALE_UP_ABOVE} with one slow actor", interval=2)  # fmt: skip
        too_few = seen[-1]
        throttle.stop()
        dep.play("actor", replicas=3, replace=True)
        wait_for(dep.scrapes_every_pod, 120, "3 actors scraped", 1)
        wait_for(lambda: ratio(lambda r: r < SCALE_DOWN_BELOW), 180,
                 f"the ratio below {SCALE_DOWN_BELOW} with three free actors", interval=2)  # fmt: skip
        too_many = seen[-1]
    except BaseException:
        print("ratios seen:", seen)
        print(dep.logs())
        raise
    finally:
        throttle.stop()
    print(f"actor demand ratio in podman: one slow actor {too_few:.2f}, three free {too_many:.2f}")


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
            if c["Id"] in dep.containers or adapter.workload_of(c.get("PodName") or "") in ORDER]  # fmt: skip
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
