"""The actor demand ratio that deploy/k8s/autoscaling scales the actors on, evaluated by a real
Prometheus scraping real services (replay, learner and actors as processes on loopback, the
`apexrl` entry points the images run) in the two states it must tell apart:

- actors too few for the learner: one actor, stopped 90% of the time (SIGSTOP/SIGCONT, as a
  slow env would pace it), feeds a learner that could train on far more: the learner waits
  for batches, and the ratio must rise above the scale-up threshold;
- too many: three free actors feed a learner that takes 16 samples per inserted item (the
  replay's rate limiter): the limiter holds their inserts, and the ratio must fall below the
  scale-down threshold.

The query is keda-scaledobject.yaml's (the adapter's is the same: tests/deploy checks), with
its [2m] windows shortened to WINDOW so that each state shows within seconds.
"""

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.conftest import Throttle, metric, wait_for

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SCALED_OBJECT = ROOT / "deploy/k8s/autoscaling/keda-scaledobject.yaml"
WINDOW_SECONDS = 10
WINDOW = f"{WINDOW_SECONDS}s"
# The HPA's tolerance around the target 1 (tests/deploy/test_autoscaling.py).
SCALE_UP_ABOVE, SCALE_DOWN_BELOW = 1.1, 0.9


def demand_query() -> str:
    (trigger,) = yaml.safe_load(SCALED_OBJECT.read_text())["spec"]["triggers"]
    query = trigger["metadata"]["query"]
    assert query.count("[2m]") == 2, query
    return query.replace("[2m]", f"[{WINDOW}]")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Prometheus:
    """A real Prometheus scraping the targets written to its file_sd file every second."""

    def __init__(self, work: Path):
        self.targets = work / "targets.json"
        self.targets.write_text("[]")
        config = work / "prometheus.yml"
        config.write_text(
            yaml.safe_dump({
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "scrape_configs": [{
                    "job_name": "apexrl",
                    "file_sd_configs": [{"files": [str(self.targets)], "refresh_interval": "1s"}],
                }],
            })
        )  # fmt: skip
        self.url = f"http://127.0.0.1:{free_port()}"
        self.log = open(work / "prometheus.log", "w")  # noqa: SIM115 (closed in stop)
        self.process = subprocess.Popen(
            ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={work / 'tsdb'}",
             f"--web.listen-address={self.url.removeprefix('http://')}"],
            stdout=self.log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        wait_for(self._ready, 30, "Prometheus to be ready", interval=0.2)

    def _ready(self) -> bool:
        assert self.process.poll() is None, "Prometheus exited"
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as got:
                return got.status == 200
        except OSError:
            return False

    def scrape(self, pods: dict[str, int]) -> None:
        """pod name -> metrics port, labelled as the Kubernetes service discovery labels them."""
        groups = [{"targets": [f"127.0.0.1:{port}"], "labels": {"namespace": "apexrl", "pod": pod}}
                  for pod, port in pods.items()]  # fmt: skip
        tmp = self.targets.with_suffix(".tmp")
        tmp.write_text(json.dumps(groups))
        os.replace(tmp, self.targets)

    def value(self, query: str) -> float | None:
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": query})
        with urllib.request.urlopen(url, timeout=5) as got:
            result = json.load(got)["data"]["result"]
        return float(result[0]["value"][1]) if result else None

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(30)
        self.log.close()


@pytest.mark.timeout(300)
@pytest.mark.skipif(shutil.which("prometheus") is None, reason="needs prometheus (apt-get)")
def test_the_demand_ratio_tells_too_few_actors_from_too_many(service_process, tmp_path):
    query = demand_query()
    replay = service_process("replay", "--min-size-to-sample", "500", "--samples-per-insert",
                             "16", "--error-buffer", "1024")  # fmt: skip
    learner = service_process("learner", "--replay", replay.address, "--batch-size", "64",
                              "--threads", "1")  # fmt: skip

    def actor():
        return service_process("actor", "--replay", replay.address, "--learner",
                               learner.address, "--num-envs", "2")  # fmt: skip

    actors = [actor()]
    prometheus = Prometheus(tmp_path)
    pods = {"replay-0": replay.metrics_port, "learner": learner.metrics_port,
            "actor-0": actors[0].metrics_port}  # fmt: skip
    seen: list[float | None] = []
    throttle = Throttle(actors[0].process.pid)

    def ratio_is(predicate) -> bool:
        seen.append(prometheus.value(query))
        return seen[-1] is not None and predicate(seen[-1])

    try:
        prometheus.scrape(pods)
        # The learner's wait for its first batch (min_size_to_sample) ends in one lump: the
        # ratio counts from a full window after it, in the steady state.
        wait_for(lambda: metric(learner.metrics_port, "apexrl_learner_updates_total") > 0, 90,
                 "the learner's first update")  # fmt: skip
        steady = time.monotonic() + WINDOW_SECONDS + 2

        def above() -> bool:
            return ratio_is(lambda r: r > SCALE_UP_ABOVE) and time.monotonic() > steady

        wait_for(above, 90, f"the ratio above {SCALE_UP_ABOVE} with one slow actor", interval=1)
        too_few = seen[-1]
        throttle.stop()
        actors += [actor(), actor()]
        pods |= {f"actor-{i}": a.metrics_port for i, a in enumerate(actors)}
        prometheus.scrape(pods)
        wait_for(lambda: ratio_is(lambda r: r < SCALE_DOWN_BELOW), 90,
                 f"the ratio below {SCALE_DOWN_BELOW} with three free actors", interval=1)  # fmt: skip
        too_many = seen[-1]
    except BaseException:
        print("ratios seen:", seen)
        for proc in [replay, learner, *actors]:
            print(proc.log_path.name, proc.log()[-1500:])
        raise
    finally:
        throttle.stop()
        prometheus.stop()
    print(f"actor demand ratio: one slow actor {too_few:.2f}, three free actors {too_many:.2f}")
    for proc in [*actors, learner, replay]:
        proc.stop()
