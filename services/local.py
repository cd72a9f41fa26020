"""Local mode: the distributed system on one machine, each service its own process on loopback.

The children are started with the same `apexrl <service>` entry points the containers use,
configured by one TOML file in the run folder (as a ConfigMap would), on ports they pick
themselves (port 0, reported through ready files). Progress comes from their Prometheus
endpoints, the same numbers the dashboards show.
"""

import csv
import ctypes
import dataclasses
import json
import logging
import math
import os
import signal
import subprocess
import sys
import threading
import time
import tomllib
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import tomli_w
from prometheus_client.parser import text_string_to_metric_families

from apexrl import config as cfg
from apexrl import plot
from apexrl.algorithms.envs import EnvOptions, is_atari, reward_threshold
from apexrl.common.ports import free_port
from apexrl.common.tensorboard import Scalars
from apexrl.replay_tables import entry as table_entry
from apexrl.schedules import Schedule

log = logging.getLogger(__name__)

# Settings local mode gives each service, under the algorithm's presets for the env and the
# user's --config file.
SERVICE_DEFAULTS = {
    "replay": {},
    "learner": {"checkpoint_interval": 0.0},
    "actor": {},
    "evaluator": {},
}
# On top of those for Atari (ALE/... ids), whatever the algorithm: 4 envs an actor and short
# evaluations (a Pong episode is 800+ agent steps).
ATARI_DEFAULTS = {
    "actor": {"num_envs": 4},
    "evaluator": {"episodes": 2, "confirm_episodes": 4, "interval": 30.0, "window": 0},
}

# Targets for envs gymnasium gives no reward_threshold (mean return of the best model).
TARGETS = {"Pendulum-v1": -200.0}

# A table's settings: local mode takes the tables from the algorithm's builder.
TABLE_SETTINGS = {f.name for f in dataclasses.fields(cfg.ReplayTableConfig)} | {"table", "tables"}


def default_target(env_id: str) -> float | None:
    """The best model's score that counts as solved on `env_id` when none is given."""
    return TARGETS.get(env_id, reward_threshold(env_id))


def parse(argv: list[str]) -> cfg.LocalConfig:
    """Local mode's settings; the algorithm's own ones over its presets for the env."""
    from apexrl import algorithms

    prog = "apexrl local"
    config = cfg.parse(cfg.LocalConfig, argv, "local", prog, algorithms.REGISTRY)
    builder = algorithms.get(config.algorithm)
    presets = builder.presets(config.env)
    if presets.get(builder.name):
        defaults = {builder.name: presets[builder.name]}
        config = cfg.parse(cfg.LocalConfig, argv, "local", prog, algorithms.REGISTRY, defaults)
    return config


def signature(config: cfg.AgentConfig) -> str:
    """The replay `signature` setting for the algorithm's items on the env (torch-free: the
    parent process of local mode never imports torch)."""
    from apexrl import algorithms

    return ",".join(column.spec() for column in algorithms.transition_columns(config))


def replay_tables(config: cfg.AgentConfig, shards: int) -> list[dict]:
    """The algorithm's tables as [[replay.tables]] entries, each shard's even share of their
    sizes (so the totals stay as set)."""
    from apexrl import algorithms

    if shards < 1:
        raise ValueError(f"replay_shards: must be >= 1, got {shards}")
    tables = []
    for table in algorithms.make(config).tables():
        entry = table_entry(table)
        entry["capacity"] = math.ceil(table.capacity / shards)
        if table.rate_limiter == "ratio":
            entry["min_size_to_sample"] = math.ceil(table.min_size_to_sample / shards)
            entry["error_buffer"] = table.error_buffer / shards
        tables.append(entry)
    return tables


def dump_toml(data: dict) -> str:
    """A config as TOML text (a schedule as its table: schedules.py)."""

    def plain(value):
        if isinstance(value, Schedule):
            return value.table()
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, list):
            return [plain(v) for v in value]
        return value

    return tomli_w.dumps(plain(data))


def _die_with_parent() -> None:
    """In the child: get SIGTERM if local mode dies, even by SIGKILL (Linux)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


@dataclass
class Child:
    name: str
    process: subprocess.Popen
    ports: dict
    ready_file: Path
    episodes: tuple[float, ...] = (0.0, 0.0)  # return sum and count at the previous row

    def metrics(self) -> dict[str, float]:
        """Sum of every sample of every metric, by sample name (none before it is ready)."""
        if not self.ports:
            if not self.ready_file.exists():
                return {}
            self.ports = json.loads(self.ready_file.read_text())
        url = f"http://127.0.0.1:{self.ports['metrics_port']}/metrics"
        with urllib.request.urlopen(url, timeout=2) as response:
            text = response.read().decode()
        totals: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
        return totals


class Run:
    def __init__(self, config: cfg.LocalConfig, user_file: dict, run_dir: Path):
        self.config, self.run_dir = config, run_dir
        self.children: list[Child] = []
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)
        (run_dir / "ready").mkdir(exist_ok=True)
        agent = {
            f.name: getattr(config, f.name)
            for f in dataclasses.fields(cfg.AgentConfig)
            if not f.metadata.get("internal")
        }
        settings = {**agent, "log_level": config.log_level}
        from apexrl import algorithms

        builder = algorithms.get(config.algorithm)
        presets = builder.presets(config.env)
        atari = ATARI_DEFAULTS if is_atari(config.env) else {}
        for section, defaults in SERVICE_DEFAULTS.items():
            settings[section] = {
                **defaults,
                **presets.get(section, {}),
                **atari.get(section, {}),
                **user_file.get(section, {}),
            }
        settings[builder.name] = dataclasses.asdict(config.algo)
        given = sorted(TABLE_SETTINGS & set(user_file.get("replay", {})))
        if given:
            raise ValueError(
                f"[replay] {given[0]}: local mode makes the replay's tables from algorithm"
                f" {builder.name}'s builder; set its sizes in [{builder.name}]"
                f" (`apexrl local --algorithm {builder.name} --help`)"
            )
        settings["replay"]["tables"] = replay_tables(config, config.replay_shards)
        if config.video_every < 0:
            raise ValueError(f"video_every: must be >= 0 (0: no videos), got {config.video_every}")
        if config.video_every:
            from apexrl.algorithms import video

            video.prepare(config.env, EnvOptions.of(config), str(run_dir / "videos"))
            settings["evaluator"]["video_every"] = config.video_every
            settings["evaluator"]["video_dir"] = str(run_dir / "videos")
        settings["learner"].setdefault("checkpoint_dir", str(run_dir / "checkpoints"))
        self.checkpoint_dir = Path(settings["learner"]["checkpoint_dir"])
        self.config_path = run_dir / "config.toml"
        self.config_path.write_text(dump_toml(settings))
        self.settings = settings

    def launch(self, name: str, command: str, *flags: str) -> Child:
        ready = self.run_dir / "ready" / f"{name}.json"
        ready.unlink(missing_ok=True)  # a reused run folder holds the previous run's ports
        args = [sys.executable, "-m", "apexrl.cli", command, "--config", str(self.config_path)]
        args += ["--host", "127.0.0.1", "--metrics-port", "0", "--ready-file", str(ready), *flags]
        with open(self.run_dir / "logs" / f"{name}.log", "w") as log_file:
            process = subprocess.Popen(
                args, stdout=log_file, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent
            )
        child = Child(name, process, {}, ready)
        self.children.append(child)
        return child

    def wait_ready(self, children: list[Child], timeout: float = 120) -> None:
        """Waits until each child has written its ready file (its ports)."""
        deadline = time.monotonic() + timeout
        for child in children:
            while not child.ready_file.exists():
                if child.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"{child.name} did not start; see {self.run_dir}/logs/{child.name}.log"
                    )
                time.sleep(0.05)
            child.ports = json.loads(child.ready_file.read_text())

    launched = 0.0  # unix time start_all began
    learner_address = ""
    evaluator: Child | None = None

    def start_all(self) -> None:
        """Starts the replay, the learner and the actors at once (imports dominate start-up),
        then waits until all serve. The evaluator comes next (start_evaluator), once the
        learner serves: on two cores its imports would otherwise compete with the learner's
        (torch) on the way to the first version, which it needs to play anything; and it is
        there for the first versions, which it plays in order where the algorithm asks for
        every version to be played (a solving version comes within the first seconds of
        impala on CartPole).

        The gRPC ports are picked here, not by the children (port 0), so that no child has to
        wait for another's ready file before it can be told where its peers are.
        """
        self.launched = time.time()
        shards = self.config.replay_shards
        ports = [free_port() for _ in range(shards)]
        replay_address = ",".join(f"127.0.0.1:{port}" for port in ports)
        self.learner_address = learner_address = f"127.0.0.1:{free_port()}"
        for shard, port in enumerate(ports):
            name = "replay" if shards == 1 else f"replay-{shard}"
            self.launch(name, "replay", "--port", str(port), *self.shard_flags(shard))
        self.launch(
            "learner",
            "learner",
            "--port",
            learner_address.split(":")[1],
            "--replay",
            replay_address,
        )
        for i in range(self.config.actors):
            self.launch(
                f"actor-{i}", "actor", "--replay", replay_address, "--learner", learner_address
            )
        self.wait_ready(self.children)

    def start_evaluator(self) -> None:
        """Launches the evaluator without waiting for it (its metrics count once it is ready)."""
        self.evaluator = self.launch("evaluator", "evaluator", "--learner", self.learner_address)

    def shard_flags(self, shard: int) -> list[str]:
        """A shard's id (its tables' sizes are each shard's share already)."""
        return [] if self.config.replay_shards == 1 else ["--shard", str(shard)]

    def stop_all(self, timeout: float = 60) -> None:
        """SIGTERM in dependency order, each group at once: actors and evaluator, then the
        learner (final checkpoint), then the replay shards, so nobody loses the peer it is
        flushing to."""
        replays = [c for c in self.children if c.name.startswith("replay")]
        learner = [c for c in self.children if c.name == "learner"]
        workers = [c for c in self.children if c not in replays and c not in learner]
        groups = [g for g in (workers, learner, replays) if g]
        for group in groups:
            running = [c for c in group if c.process.poll() is None]
            for child in running:
                child.process.send_signal(signal.SIGTERM)
            for child in running:
                try:
                    child.process.wait(timeout)
                except subprocess.TimeoutExpired:
                    log.warning("%s did not stop in %.0f s: killing it", child.name, timeout)
                    child.process.kill()
                    child.process.wait()

    def dead_child(self) -> Child | None:
        return next((c for c in self.children if c.process.poll() is not None), None)


def _format_count(n: float) -> str:
    return f"{n:,.0f}"


FIELDS = ["seconds", "startup_seconds", "env_steps", "env_steps_per_s", "updates", "updates_per_s", "replay_size",
          "replay_bytes_per_item", "actor_mean_return",
          "eval_mean_return", "eval_rounds", "eval_best_mean_return", "eval_best_version",
          "parameter_version", "parameter_bytes", "parameter_change_bytes", "loss",
          "prefetch_wait_fraction",
          "transitions_dropped"]  # fmt: skip


def main(argv: list[str]) -> int:
    config = parse(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    user_file: dict = {}
    config_file = os.environ.get("APEXRL_CONFIG", "")
    if "--config" in argv:
        config_file = argv[argv.index("--config") + 1]
    if config_file:
        with open(config_file, "rb") as fh:
            user_file = tomllib.load(fh)
    target = config.target_return
    if math.isnan(target):
        target = default_target(config.env)
    if target is None:
        sys.exit(f"apexrl local: {config.env} has no reward_threshold: pass --target-return")
    run_dir = Path(config.run_dir or f"runs/{config.env}-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        run = Run(config, user_file, run_dir)
        scalars = (
            Scalars(str(Path(config.tensorboard) / run_dir.name)) if config.tensorboard else None
        )
    except ValueError as err:  # settings that can never work: say which, before any process
        print(f"apexrl local: error: {err}", file=sys.stderr)
        return 2

    stop = threading.Event()
    interrupted = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _: (interrupted.append(signum), stop.set()))

    rows: list[dict] = []
    outcome, code = "", 1
    started = time.monotonic()
    try:
        run.start_all()
        run.start_evaluator()
        print(
            f"apexrl local: {config.env}, {config.actors} actors, run folder {run_dir}", flush=True
        )
        outcome, code = _monitor(run, config, target, rows, stop, started, scalars)
    except RuntimeError as err:
        outcome = f"not solved: {err}"
    finally:
        if interrupted and not outcome:
            outcome, code = "not solved: interrupted", 130
        run.stop_all()
        _write_outputs(run_dir, rows, target)
        if scalars is not None:
            scalars.close()
    if code == 0:
        outcome += "; " + _best_model(run.checkpoint_dir)
    print(("\n" if sys.stdout.isatty() else "") + outcome, flush=True)
    return code


def _monitor(
    run: Run, config: cfg.LocalConfig, target: float, rows: list[dict], stop, started, scalars
) -> tuple[str, int]:
    tty = sys.stdout.isatty()
    last_print = 0.0
    previous: dict | None = None
    with open(run.run_dir / "metrics.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, FIELDS)
        writer.writeheader()
        while not stop.wait(config.progress_interval):
            dead = run.dead_child()
            if dead is not None:
                return (
                    f"not solved: {dead.name} exited with code {dead.process.returncode} (see {run.run_dir}/logs/{dead.name}.log)",
                    1,
                )
            row = _collect(run, time.monotonic() - started, previous)
            rows.append(row)
            writer.writerow(row)
            fh.flush()
            if scalars is not None:
                scalars.add(row, int(row["env_steps"]))
            previous = row
            if tty or row["seconds"] - last_print >= 5:
                line = (f"{row['seconds']:6.1f} s  env steps {_format_count(row['env_steps'])} "
                        f"({_format_count(row['env_steps_per_s'])}/s)  updates {_format_count(row['updates'])} "
                        f"({_format_count(row['updates_per_s'])}/s)  replay {_format_count(row['replay_size'])}  "
                        f"eval {row['eval_mean_return']:.1f}")  # fmt: skip
                print(("\r" + line + "   ") if tty else line, end="" if tty else "\n", flush=True)
                last_print = row["seconds"]
            if row["eval_best_version"] > 0 and row["eval_best_mean_return"] >= target:
                return (
                    f"solved in {row['seconds']:.1f} s ({_format_count(row['env_steps'])} env steps)"
                    f" by version {row['eval_best_version']:.0f}"
                    f" (mean return {row['eval_best_mean_return']:.1f})",
                    0,
                )
            if row["seconds"] > config.max_seconds or (
                config.max_env_steps and row["env_steps"] > config.max_env_steps
            ):
                return (f"not solved in {row['seconds']:.1f} s ({_format_count(row['env_steps'])} env steps): "
                        f"best evaluation {max((r['eval_mean_return'] for r in rows), key=_score):.1f} < {target:g}"), 1  # fmt: skip
    return "", 130


def _score(value: float) -> float:
    """Orders scores with NaN (no evaluation yet) below every real one."""
    return -math.inf if math.isnan(value) else value


def _collect(run: Run, seconds: float, previous: dict | None) -> dict:
    totals: dict[str, float] = {}
    first_steps = []  # each actor's first env step (unix time)
    ended = [0.0, 0.0]  # return sum and count of the actors' episodes ended since the last row
    for child in run.children:
        try:
            metrics = child.metrics()
        except OSError:  # a child busy or restarting: its numbers come next time
            continue
        for name, value in metrics.items():
            totals[name] = totals.get(name, 0.0) + value
            if name == "apexrl_actor_first_step_timestamp_seconds" and value > 0:
                first_steps.append(value)
        now = tuple(metrics.get(f"apexrl_actor_episode_return_{s}", 0.0) for s in ("sum", "count"))
        # Fewer episodes than before: the actor restarted, its counters from 0 (as rate() does).
        before = child.episodes if now[1] >= child.episodes[1] else (0.0, 0.0)
        ended = [e + n - b for e, n, b in zip(ended, now, before, strict=True)]
        child.episodes = now
    row = {
        "seconds": round(seconds, 3),
        # From launch to the first env step of any actor (start-up: imports, servers, the
        # first parameters); NaN until an actor has stepped.
        "startup_seconds": round(min(first_steps) - run.launched, 3) if first_steps else math.nan,
        "env_steps": totals.get("apexrl_actor_env_steps_total", 0.0),
        "updates": totals.get("apexrl_learner_update_step", 0.0),
        "replay_size": totals.get("apexrl_replay_size", 0.0),
        "replay_bytes_per_item": round(
            totals.get("apexrl_replay_stored_bytes", 0.0)
            / max(totals.get("apexrl_replay_size", 0.0), 1.0),
            1,
        ),
        "eval_mean_return": totals.get("apexrl_evaluation_mean_return", 0.0),
        "eval_rounds": totals.get("apexrl_evaluation_rounds_total", 0.0),
        # The best model the learner keeps: its score over both evaluation rounds.
        "eval_best_version": totals.get("apexrl_evaluation_best_version", 0.0),
        "parameter_version": totals.get("apexrl_learner_parameter_version", 0.0),
        "parameter_bytes": totals.get("apexrl_learner_parameter_bytes", 0.0),
        "parameter_change_bytes": totals.get("apexrl_learner_parameter_change_bytes", 0.0),
        "loss": totals.get("apexrl_learner_loss", math.nan),
        "prefetch_wait_fraction": totals.get("apexrl_learner_prefetch_wait_fraction", math.nan),
        "transitions_dropped": totals.get("apexrl_actor_transitions_dropped_total", 0.0),
        "actor_mean_return": round(ended[0] / ended[1], 3) if ended[1] else math.nan,
    }
    # A gauge reads 0 before it is set: no evaluation (or best model) yet is NaN, not a score of 0.
    if not row["eval_rounds"]:
        row["eval_mean_return"] = math.nan
    best = totals.get("apexrl_evaluation_best_mean_return", math.nan)
    row["eval_best_mean_return"] = best if row["eval_best_version"] > 0 else math.nan
    dt = seconds - previous["seconds"] if previous else seconds
    for key in ("env_steps", "updates"):
        before = previous[key] if previous else 0.0
        row[f"{key}_per_s"] = round((row[key] - before) / dt, 1) if dt > 0 else 0.0
    return row


def _best_model(checkpoint_dir: Path) -> str:
    """What the learner kept as the best model: the parameters that earned "solved"."""
    from apexrl.common import checkpoint
    from apexrl.learner.best import KIND as BEST

    found = checkpoint.load_newest(checkpoint_dir, BEST)
    if found is None:
        return f"no best model in {checkpoint_dir}"
    path, meta, _ = found
    return (f"best model: version {meta['version']} (update {meta['update_step']}), mean return"
            f" {meta['mean_return']:.1f} over {meta['protocol']['episodes']} episodes, in {path}"
            f" (play it: apexrl eval --checkpoint {checkpoint_dir})")  # fmt: skip


def _write_outputs(run_dir: Path, rows: list[dict], target: float) -> None:
    if rows:
        plot.learning_curve(run_dir, rows, target)
