"""Scale: hundreds of simulated actors against a real learner and replay shards, on loopback.

    .venv/bin/python benchmarks/scale.py --actors 64 --seconds 60
    .venv/bin/python benchmarks/scale.py --actors 16 64 256 512 --seconds 60   # a sweep
    .venv/bin/python benchmarks/scale.py --actors 64 --seconds 60 --relays 1   # via a relay
    .venv/bin/python benchmarks/scale.py --actors 64 --seconds 120 --churn 0.01  # 1%/s churn

A real `apexrl learner` trains the dqn Atari network (its presets for the game: batch 32,
precision auto) on the CPU from 1-4 real `apexrl replay` shards (the builder's table, the
rate limiter's ratio off so the learner runs at its own pace, not the actors'). The actors
are simulated (benchmarks/scale_actors.py: many per process, no env, no torch) and reach the
services through the shipping clients: their own channel each, a lease, parameter pulls every
pull_interval agent steps, and inserts of recorded transitions (played by random actors and
packed as the actor packs them: one zstd frame per transition) at steps_per_s agent steps a
second each. The default 34.7 is Ape-X's: 12.5K transitions/s from 360 actors. With
`relays` R, R real `apexrl relay` processes pull from the learner and the actors pull their
parameters from them (actor i from relay i mod R), renewing their leases at the learner.
With `churn` c, actors leave and new ones join in their place, c x N a second in all, from
one pull period after the start (benchmarks/scale_actors.py says how).

The learner is pinned to one core and everything else (replay, simulated actors, this
process) to the other: what serving the fleet costs the learner shows in its own updates/s,
measured against the same learner serving `baseline_actors` (2) in the same run, just before
each fleet. The report says what each process used of its core.

Per fleet of N: a warm-up of one pull period (every actor started, and pulled once), then a
window of `seconds`. Then the fleet stops and the leases lapse before the next one starts.
One JSON line per N on stdout (the last is the last N's); progress on stderr.

- inserts_offered_per_s / inserts_accepted_per_s: transitions the schedules offered / replay
  acknowledged in the window; inserts_lost: what the shards counted minus what the clients
  saw acknowledged, over the whole run (0: nothing lost, nothing doubled);
- pulls_per_s, parameter_bytes_per_s, pull_p50_s / pull_p99_s: GetParameters answers in the
  window, their bytes, the whole client call (decode and change sets applied included; with
  relays, the lease renewal at the learner too); learner_parameter_bytes_sent_per_s: what the
  learner sent in GetParameters answers (with relays: the versions they pulled and the
  actors' lease renewals);
- learner_updates_per_s and learner_updates_ratio (over the baseline); learner_cpu_per_update_s
  and learner_updates_ratio_per_cpu (the baseline's CPU per update over the fleet's): the
  ratio the learner would see on a core of its own, when other work shares its core;
- replay_insert_p99_s: the client's insert call, at the 99th percentile;
- rss_per_connection_bytes: the learner's resident memory grown while serving N actors, per
  actor (replay_rss_per_connection_bytes: the shards', summed);
- ladder_exact: every answer's exploration equals epsilon_ladder(index, count), its count
  is the actors whose leases were live when the learner answered, a new lease takes the last
  place and a place never rises within a lease (benchmarks/scale_ladder.py); without churn
  also the actors' last places are 0 .. N-1;
- churn_left, churn_joined: actors that left over the fleet's run, and new ones that joined;
- relay_answers, relay_bytes_served: the relays' GetParameters answers and their bytes, over
  the whole run (0 without relays);
- errors: failed calls; cpu: each role's CPU seconds per second and each core's busy share.
"""

import argparse
import json
import math
import multiprocessing as mp
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
from scale_actors import Fleet, run_process
from scale_ladder import ladder
from scale_services import (
    Probe,
    prefill,
    replay_inserts,
    scrape,
    service,
    usage,
    wait_for_updates,
)

from apexrl.local.settings import dump_toml, parse, replay_tables


@dataclass(frozen=True)
class Settings:
    actors: tuple[int, ...] = (64,)
    seconds: float = 60.0  # each fleet's measured window
    baseline_actors: int = 2
    baseline_seconds: float = 30.0
    shards: int = 1
    env: str = "ALE/Pong-v5"
    steps_per_s: float = 34.7  # each actor's agent steps a second (Ape-X: 12.5K / 360)
    pull_interval: int = 400  # agent steps between pulls (the actor's default, Ape-X's)
    insert_batch: int = 64
    lease_seconds: float = 30.0  # must outlast a pull period (400 / 34.7 = 11.5 s)
    actors_per_process: int = 64
    recorded: int = 6_400  # recorded transitions the actors replay
    capacity: int = 200_000  # over all shards
    paused: int = 0  # actors that fall silent past their lease mid-window, then come back
    pin: bool = True  # learner on core 0, the rest on core 1
    relays: int = 0  # parameter relays between the learner and the actors (0: none)
    churn: float = 0.0  # fraction of the actors that leave a second, as many new ones joining

    @property
    def pull_period(self) -> float:
        return self.pull_interval / self.steps_per_s


def log(message: str) -> None:
    print(f"[scale {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --- settings files and recorded transitions ----------------------------------------------


def configs(s: Settings, folder: Path) -> tuple[Path, Path]:
    """The replay's and the learner's config files: the algorithm's table and presets."""
    from apexrl.algorithms import get

    config = parse(["--env", s.env, "--replay-shards", str(s.shards)])
    tables = [
        {**t, "capacity": s.capacity // s.shards, "samples_per_insert": 0.0}
        for t in replay_tables(config, s.shards)
    ]
    replay = folder / "replay.toml"
    replay.write_text(dump_toml({"replay": {"tables": tables}}))
    presets = get("dqn").presets(s.env)
    learner_settings = {
        **presets.get("learner", {}),
        "device": "cpu",
        "threads": 1,
        "lease_seconds": s.lease_seconds,
        "checkpoint_interval": 0.0,
    }
    learner = folder / "learner.toml"
    learner.write_text(
        dump_toml(
            {"algorithm": "dqn", "env": s.env, "dqn": presets["dqn"], "learner": learner_settings}
        )
    )
    return replay, learner


def recorded(s: Settings) -> list[dict]:
    from atari import played_transitions

    return played_transitions(s.env, s.recorded, seed=1)


# --- one fleet -----------------------------------------------------------------------------


def quantile(values: list[float], q: float) -> float:
    return round(float(np.quantile(values, q)), 4) if values else math.nan


def fleet_report(
    s: Settings,
    n: int,
    records: list[dict],
    window: tuple[float, float],
    whole_bytes: float,
) -> dict:
    """The fleet's calls in the window; whole_bytes: what an answer holding every array
    weighs (change sets weigh less)."""
    seconds = window[1] - window[0]

    def inside(t: float) -> bool:
        return window[0] <= t < window[1]

    pulls = [p for r in records for p in r["pulls"] if inside(p[0])]
    inserts = [i for r in records for i in r["inserts"] if inside(i[0])]
    offered = sum(inside(t) for r in records for t in r["offered"])
    ok_pulls = [p for p in pulls if p[3]]
    ok_inserts = [i for i in inserts if i[3]]
    errors = sum(not c[3] for r in records for c in r["pulls"] + r["inserts"])
    return {
        "actors": n,
        "seconds": round(seconds, 1),
        "inserts_offered_per_s": round(offered * s.insert_batch / seconds, 1),
        "inserts_accepted_per_s": round(sum(i[2] for i in ok_inserts) / seconds, 1),
        "pulls_per_s": round(len(ok_pulls) / seconds, 2),
        "parameter_bytes_per_s": round(sum(p[2] for p in ok_pulls) / seconds),
        "pull_p50_s": quantile([p[1] for p in ok_pulls], 0.5),
        "pull_p99_s": quantile([p[1] for p in ok_pulls], 0.99),
        "pull_max_s": quantile([p[1] for p in ok_pulls], 1.0),
        "whole_pulls": sum(p[2] >= whole_bytes for p in ok_pulls),
        "replay_insert_p50_s": quantile([i[1] for i in ok_inserts], 0.5),
        "replay_insert_p99_s": quantile([i[1] for i in ok_inserts], 0.99),
        "ladder": ladder(records, n, window, s.lease_seconds, churn=s.churn > 0),
        # Over the whole fleet's run: actors that left, and the new ones that took their place.
        "churn_left": sum(r["left"] is not None for r in records),
        "churn_joined": sum(r["joined"] is not None for r in records),
        "errors": errors,
        "error_messages": [m for r in records for m in r["errors"]][:10],
        "acknowledged_items": sum(i[2] for r in records for i in r["inserts"] if i[3]),
    }


def run_fleet(s: Settings, n: int, seconds: float, services: dict, batches: list[dict]) -> dict:
    """n simulated actors for a warm-up and `seconds`; their figures and the learner's."""
    learner, replays, relays = services["learner"], services["replays"], services["relays"]
    replay_address = ",".join(r.address for r in replays)
    paused = s.paused if n > s.paused else 0
    warmup = s.pull_period + 1.0
    pause = (warmup + seconds / 4, warmup + seconds / 4 + s.lease_seconds + s.pull_period + 2)
    fleet = Fleet(
        learner.address,
        replay_address,
        s.steps_per_s,
        s.pull_interval,
        s.insert_batch,
        n,
        paused,
        pause,
        relays=tuple(r.address for r in services["relays"]),
        churn=s.churn,
    )
    ctx = mp.get_context("spawn")
    ready, start, stop, results = ctx.Semaphore(0), ctx.Value("d", 0.0), ctx.Event(), ctx.Queue()
    groups = [
        list(range(i, min(i + s.actors_per_process, n))) for i in range(0, n, s.actors_per_process)
    ]
    procs = [
        ctx.Process(target=run_process, args=(g, fleet, batches, ready, start, stop, results))
        for g in groups
    ]
    before = Probe(roles(services, []), learner, replays)
    for p in procs:
        p.start()
    try:
        for _ in procs:
            if not ready.acquire(timeout=300):
                raise RuntimeError("simulated actors did not start")
        start.value = t0 = time.monotonic() + 0.5
        time.sleep(max(0.0, t0 + warmup - time.monotonic()))
        a = Probe(roles(services, procs), learner, replays)
        time.sleep(seconds)
        b = Probe(roles(services, procs), learner, replays)
        stop.set()
        records = [r for _ in procs for r in results.get(timeout=300)]
    finally:
        stop.set()
        for p in procs:
            p.join(60)
            if p.is_alive():
                p.terminate()
    window = (a.t, b.t)
    report = fleet_report(s, n, records, window, b.parameter_bytes)
    report |= {
        "learner_updates_per_s": round((b.updates - a.updates) / (b.t - a.t), 2),
        # The learner's CPU seconds per update: on a core shared with other work, what the
        # fleet costs the learner shows here even when its share of the core moves.
        "learner_cpu_per_update_s": round(
            (b.cpu["learner"] - a.cpu["learner"]) / max(b.updates - a.updates, 1), 5
        ),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "versions_per_s": round((b.version - a.version) / (b.t - a.t), 2),
        # What the learner sent in GetParameters answers: to the actors, or to the relays and
        # the actors' lease renewals.
        "learner_parameter_bytes_sent_per_s": round((b.bytes_sent - a.bytes_sent) / (b.t - a.t)),
        "learner_prefetch_wait_fraction": round(b.prefetch_wait, 3),
        "rss_per_connection_bytes": round((b.learner_rss - before.learner_rss) / n),
        "replay_rss_per_connection_bytes": round((b.replay_rss - before.replay_rss) / n),
        # Over the whole run: what the relays answered and the bytes they sent.
        "relay_answers": sum(
            scrape(r.metrics_port).get("apexrl_relay_answers_total", 0) for r in relays
        ),
        "relay_bytes_served": sum(
            scrape(r.metrics_port).get("apexrl_relay_parameter_bytes_served_total", 0)
            for r in relays
        ),
        **usage(a, b),
    }
    return report


def roles(services: dict, procs: list) -> dict[str, list[int]]:
    return {
        "learner": [services["learner"].process.pid],
        "replay": [r.process.pid for r in services["replays"]],
        "relays": [r.process.pid for r in services["relays"]],
        "actors": [p.pid for p in procs if p.pid is not None],
        "this_process": [os.getpid()],
    }


# --- the run -------------------------------------------------------------------------------


def measured(s: Settings, n: int, seconds: float, services: dict, batches: list[dict]) -> dict:
    """One fleet's report, with what the shards counted of its inserts; a fleet before it
    has stopped a lease period ago, so this one's ladder counts its own actors only."""
    if services["fleets"]:
        time.sleep(s.lease_seconds + 1.0)
    services["fleets"] += 1
    log(f"{n} actors for {seconds:g} s")
    before = replay_inserts(services["replays"])
    report = run_fleet(s, n, seconds, services, batches)
    report["inserts_lost"] = report.pop("acknowledged_items") - (
        replay_inserts(services["replays"]) - before
    )
    return report


BASELINE_KEYS = (
    "actors",
    "learner_updates_per_s",
    "learner_cpu_per_update_s",
    "pull_p99_s",
    "errors",
    "cpu_seconds_per_s",
    "load_average",
)


def compared(s: Settings, n: int, services: dict, batches: list[dict]) -> dict:
    """n actors' report, after the baseline's (none when baseline_actors is 0)."""
    base = {"learner_updates_per_s": math.nan, "errors": 0}
    if s.baseline_actors:
        base = measured(s, s.baseline_actors, s.baseline_seconds, services, batches)
    report = measured(s, n, s.seconds, services, batches)
    report["baseline"] = {k: base[k] for k in BASELINE_KEYS if k in base}
    report["learner_updates_ratio"] = round(
        report["learner_updates_per_s"] / base["learner_updates_per_s"], 3
    )
    # What the ratio is on a core of the learner's own: CPU per update, baseline over fleet.
    report["learner_updates_ratio_per_cpu"] = round(
        base.get("learner_cpu_per_update_s", math.nan) / report["learner_cpu_per_update_s"], 3
    )
    report["ladder_exact"] = report["ladder"]["exact"]
    report["errors"] += base["errors"]
    report["settings"] = asdict(replace(s, actors=(n,)))
    return report


@contextmanager
def services_for(s: Settings, folder: Path, batches: list[dict]) -> Iterator[dict]:
    """The replay shards, filled past their minimum, and the learner, training."""
    learner_core = None
    if s.pin and len(os.sched_getaffinity(0)) >= 2:
        learner_core, *others = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, set(others))  # the replays and the actors inherit it
    replay_config, learner_config = configs(s, folder)
    with ExitStack() as stack:
        replays = []
        for k in range(s.shards):
            command = ["replay", "--config", str(replay_config), "--shard", str(k)]
            replays.append(stack.enter_context(service(f"replay-{k}", command, folder, None)))
        address = ",".join(r.address for r in replays)
        prefill(address, batches, s.shards, 2_000)
        command = ["learner", "--config", str(learner_config), "--replay", address]
        learner = stack.enter_context(service("learner", command, folder, learner_core))
        log("waiting for the learner's first updates")
        wait_for_updates(learner, 20)
        relays = [
            stack.enter_context(
                service(f"relay-{k}", ["relay", "--learner", learner.address], folder, None)
            )
            for k in range(s.relays)
        ]
        yield {"learner": learner, "replays": replays, "relays": relays, "fleets": 0}


def run(s: Settings, folder: Path) -> list[dict]:
    """Every fleet of s.actors, each after its baseline; one report each (also printed)."""
    log("recording transitions")
    batches = recorded(s)
    reports = []
    with services_for(s, folder, batches) as services:
        for n in s.actors:
            reports.append(compared(s, n, services, batches))
            print(json.dumps(reports[-1]), flush=True)
    return reports


def parse_args(argv: list[str] | None = None) -> Settings:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = Settings()
    parser.add_argument("--actors", type=int, nargs="+", default=list(defaults.actors))
    for name, value in asdict(defaults).items():
        if name in ("actors", "pin"):
            continue
        parser.add_argument("--" + name.replace("_", "-"), type=type(value), default=value)
    parser.add_argument("--no-pin", action="store_true", help="leave every process on any core")
    args = vars(parser.parse_args(argv))
    pin = not args.pop("no_pin")
    if not 0 <= args["churn"] <= 1:  # also refuses nan
        parser.error(f"--churn: a fraction of the actors a second, 0 to 1, got {args['churn']}")
    return Settings(**{**args, "actors": tuple(args["actors"]), "pin": pin})


def main() -> None:
    settings = parse_args()
    with tempfile.TemporaryDirectory(prefix="apexrl-scale-") as folder:
        reports = run(settings, Path(folder))
    ok = all(r["errors"] == 0 and r["inserts_lost"] == 0 and r["ladder_exact"] for r in reports)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
