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
import socket
import subprocess
import sys
import threading
import time
import tomllib
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from apexrl import config as cfg
from apexrl.algorithms.envs import is_atari, reward_threshold

log = logging.getLogger(__name__)

# Settings local mode gives each service unless the user's --config says otherwise: sized for
# CartPole-like tasks on a small machine.
SERVICE_DEFAULTS = {
    # Each transition is sampled about 8 times: the rate limiter holds actors back so the
    # learner gets its share of the two cores.
    "replay": {
        "capacity": 100_000,
        "min_size_to_sample": 1_000,
        "samples_per_insert": 8.0,
        "error_buffer": 8_000.0,
    },
    "learner": {"checkpoint_interval": 0.0},
    "actor": {},
    "evaluator": {},
}
# On top of those for Atari (ALE/... ids): the CNN learner's settings after CleanRL's DQN Atari
# (Adam 1e-4, batch 32, the target synced every 1,000 env steps of its single actor, i.e. 250
# of its updates), its updates in bfloat16 where the hardware has it (an update of 32 on one
# core here: ~18 ms against ~31 ms in float32), 2 replays per transition so the actors keep
# pace with a CPU learner, and short evaluations (a Pong episode is 800+ agent steps).
ATARI_DEFAULTS = {
    "replay": {"min_size_to_sample": 2_000, "samples_per_insert": 2.0, "error_buffer": 4_000.0},
    "learner": {
        "batch_size": 32,
        "learning_rate": 1e-4,
        "target_update_interval": 250,
        "precision": "auto",
    },
    "actor": {"num_envs": 4},
    "evaluator": {"episodes": 2, "confirm_episodes": 4, "interval": 30.0, "window": 0},
}

# Instead of SERVICE_DEFAULTS' replay, and on top of its other sections, for the on-policy
# algorithms: the replay is a queue of unrolls (each sampled once, oldest first; actors wait
# while it is full). 2 actors x 4 envs x 32 steps = 8 unrolls = 256 steps per batch: the
# rl-baselines3-zoo's CartPole PPO (8 envs x 32 steps, 20 epochs of one minibatch, GAE lambda
# 0.8, no entropy bonus, gradient norm clipped at 0.5 (SB3's default); its gamma 0.98 and
# linear decays are not copied) but Adam at 2e-3, not the zoo's 1e-3: ppo solved CartPole-v1
# in a median 0.9 s against 2.8 s, impala in 1.1 s against 1.8 s and on Acrobot-v1 in 8.2 s
# against 9.9 s (benchmarks/time_to_solve.py, 8 seeds each, same session, 2026-12-02).
# impala takes 2 gradient steps on each batch (algorithms/impala/algorithm.py says how), with
# V-trace's lambda 1 and unnormalized advantages as published, and publishes every 4th.
# Every version is a policy worth a look (~14 a second here): the evaluator plays each in
# order, as SB3's evaluation after every rollout does, at most 30 behind the newest (~2 s),
# from the versions the learner keeps (4 MB: ~110 of CartPole's 36 KB; no Atari CNN), instead
# of the newest once a second. Once a second, ppo's evaluator saw 1 version in 14 and found
# a solving one ~2x later on CartPole (median 18.6K env steps against 9.3K, 8 seeds each, in
# an ad-hoc replica of ppo that trains and evaluates in turn). ppo's learner and actors take
# turns, so the evaluator at nice 10 plays on the CPU they leave idle; impala's actors never
# wait, and a niced evaluator starved there (it skipped most versions).
QUEUE = {"sampler": "fifo", "remover": "none", "max_times_sampled": 1, "rate_limiter": "queue"}
EVERY_VERSION = {"window": 30, "interval": 0.0}
ON_POLICY_DEFAULTS = {
    "ppo": {
        "replay": {**QUEUE, "capacity": 64},
        "learner": {"batch_size": 8, "learning_rate": 2e-3, "epochs": 20, "minibatches": 1,
                    "gae_lambda": 0.8, "entropy_cost": 0.0, "max_grad_norm": 0.5,
                    "history_mb": 4.0},
        "actor": {"num_envs": 4},
        "evaluator": {**EVERY_VERSION, "nice": 10},
    },
    "impala": {
        "replay": {**QUEUE, "capacity": 64},
        "learner": {"batch_size": 8, "learning_rate": 2e-3, "passes": 2, "gae_lambda": 1.0,
                    "normalize_advantages": False, "entropy_cost": 0.01,
                    "publish_interval": 4, "history_mb": 4.0},
        "actor": {"num_envs": 4},
        "evaluator": EVERY_VERSION,
    },
}  # fmt: skip

# One env's settings on top of its algorithm's, as rl-baselines3-zoo tunes PPO per env.
# impala on Acrobot-v1 takes ppo's learning settings (20 passes, lambda 0.8, advantages
# normalized, no entropy bonus, gradient norm 0.5; the passes clipped as APPO's): it solved in
# medians of 2.4-5.4 s and 16-28K env steps against 6.7 s and 99K with the 2 passes above
# (4 batches of 8 seeds against 1). On CartPole-v1 those settings fell behind the 2 passes
# (20 passes, 6 seeds: 4.5 s unnormalized, most seeds unsolved in 25 s normalized): each
# batch costs the learner ~20 steps there, and the queue holds the actors back while it
# trains. README, Time to solve.
ENV_DEFAULTS = {
    ("impala", "Acrobot-v1"): {
        "learner": {"passes": 20, "gae_lambda": 0.8, "normalize_advantages": True,
                    "entropy_cost": 0.0, "max_grad_norm": 0.5},
    },
}  # fmt: skip

# Targets for envs gymnasium gives no reward_threshold (mean return of the best model).
TARGETS = {"Pendulum-v1": -200.0}


def signature(config: cfg.AgentConfig) -> str:
    """The replay `signature` setting for the algorithm's transitions on the env (torch-free:
    the parent process of local mode never imports torch)."""
    from apexrl import algorithms

    return ",".join(column.spec() for column in algorithms.transition_columns(config))


def dump_toml(data: dict) -> str:
    """Writes flat tables of strings, numbers and booleans (all our configs need)."""

    def value(v) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return json.dumps(v)
        return repr(v)

    lines = [f"{k} = {value(v)}" for k, v in data.items() if not isinstance(v, dict)]
    for name, table in data.items():
        if isinstance(table, dict):
            lines += ["", f"[{name}]", *(f"{k} = {value(v)}" for k, v in table.items())]
    return "\n".join(lines) + "\n"


def free_port() -> int:
    """A TCP port free on loopback now (the OS picks it; a child binds it a moment later)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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

    def metrics(self) -> dict[str, float]:
        """Sum of every sample of every metric, by sample name."""
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
        agent = {f.name: getattr(config, f.name) for f in dataclasses.fields(cfg.AgentConfig)}
        settings = {**agent, "log_level": config.log_level}
        atari = is_atari(config.env)
        on_policy = ON_POLICY_DEFAULTS.get(config.algorithm, {})
        env_defaults = ENV_DEFAULTS.get((config.algorithm, config.env), {})
        for section, defaults in SERVICE_DEFAULTS.items():
            if section in on_policy:
                defaults = on_policy[section] if section == "replay" else {
                    **defaults, **on_policy[section]}  # fmt: skip
            # The Atari learner and replay settings are DQN's; impala and ppo keep their own.
            extra = ATARI_DEFAULTS[section] if atari and not (
                on_policy and section in ("learner", "replay")) else {}  # fmt: skip
            settings[section] = {
                **defaults,
                **extra,
                **env_defaults.get(section, {}),
                **user_file.get(section, {}),
            }
        settings["learner"].setdefault("checkpoint_dir", str(run_dir / "checkpoints"))
        # The replay takes only the algorithm's columns: a misconfigured actor is refused,
        # naming the column, instead of poisoning the table.
        settings["replay"].setdefault("signature", signature(config))
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

    def start_all(self) -> None:
        """Starts every service at once (imports dominate start-up), then waits until all serve.

        The gRPC ports are picked here, not by the children (port 0), so that no child has to
        wait for another's ready file before it can be told where its peers are.
        """
        self.launched = time.time()
        shards = self.config.replay_shards
        if shards < 1:
            raise ValueError(f"replay_shards: must be >= 1, got {shards}")
        ports = [free_port() for _ in range(shards)]
        replay_address = ",".join(f"127.0.0.1:{port}" for port in ports)
        learner_address = f"127.0.0.1:{free_port()}"
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
        self.launch("evaluator", "evaluator", "--learner", learner_address)
        self.wait_ready(self.children)

    def shard_flags(self, shard: int) -> list[str]:
        """A shard's id and its even share of the table's size settings."""
        shards = self.config.replay_shards
        if shards == 1:
            return []
        replay = self.settings["replay"]
        defaults = cfg.ReplayConfig()
        flags = ["--shard", str(shard)]
        for name in ("capacity", "min_size_to_sample", "error_buffer"):
            total = replay.get(name, getattr(defaults, name))
            share = math.ceil(total / shards) if isinstance(total, int) else total / shards
            flags += [f"--{name.replace('_', '-')}", str(share)]
        return flags

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


def plot(rows: list[dict], path: Path, target: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    evaluated = [r for r in rows if r["eval_rounds"] > 0]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, x, label in ((axes[0], "seconds", "wall seconds"), (axes[1], "env_steps", "env steps")):
        ax.plot(
            [r[x] for r in evaluated],
            [r["eval_mean_return"] for r in evaluated],
            label="evaluation mean",
        )
        ax.axhline(target, color="gray", linestyle="--", label=f"target {target:g}")
        ax.set_xlabel(label)
        ax.set_ylabel("return")
        ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


FIELDS = ["seconds", "startup_seconds", "env_steps", "env_steps_per_s", "updates", "updates_per_s", "replay_size",
          "replay_bytes_per_item",
          "eval_mean_return", "eval_rounds", "eval_best_mean_return", "eval_best_version",
          "parameter_version", "loss", "prefetch_wait_fraction",
          "transitions_dropped"]  # fmt: skip


def main(argv: list[str]) -> int:
    config = cfg.parse(cfg.LocalConfig, argv, "local", "apexrl local")
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
        target = TARGETS.get(config.env, reward_threshold(config.env))
    if target is None:
        sys.exit(f"apexrl local: {config.env} has no reward_threshold: pass --target-return")
    run_dir = Path(config.run_dir or f"runs/{config.env}-{time.strftime('%Y%m%d-%H%M%S')}")
    run = Run(config, user_file, run_dir)

    stop = threading.Event()
    interrupted = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _: (interrupted.append(signum), stop.set()))

    rows: list[dict] = []
    outcome, code = "", 1
    started = time.monotonic()
    try:
        run.start_all()
        print(
            f"apexrl local: {config.env}, {config.actors} actors, run folder {run_dir}", flush=True
        )
        outcome, code = _monitor(run, config, target, rows, stop, started)
    except RuntimeError as err:
        outcome = f"not solved: {err}"
    finally:
        if interrupted and not outcome:
            outcome, code = "not solved: interrupted", 130
        run.stop_all()
        _write_outputs(run_dir, rows, target)
    if code == 0:
        outcome += "; " + _best_model(run.checkpoint_dir)
    print(("\n" if sys.stdout.isatty() else "") + outcome, flush=True)
    return code


def _monitor(
    run: Run, config: cfg.LocalConfig, target: float, rows: list[dict], stop, started
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
    for child in run.children:
        try:
            for name, value in child.metrics().items():
                totals[name] = totals.get(name, 0.0) + value
                if name == "apexrl_actor_first_step_timestamp_seconds" and value > 0:
                    first_steps.append(value)
        except OSError:  # a child busy or restarting: its numbers come next time
            pass
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
        "loss": totals.get("apexrl_learner_loss", math.nan),
        "prefetch_wait_fraction": totals.get("apexrl_learner_prefetch_wait_fraction", math.nan),
        "transitions_dropped": totals.get("apexrl_actor_transitions_dropped_total", 0.0),
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
        plot(rows, run_dir / "learning_curve.png", target)


def eval_main(argv: list[str]) -> int:
    """apexrl eval --checkpoint PATH: plays a saved policy greedily (by default the best model)."""
    from apexrl import algorithms
    from apexrl.algorithms.base import prefixed
    from apexrl.algorithms.envs import EnvOptions
    from apexrl.algorithms.evaluation import evaluate
    from apexrl.common import checkpoint
    from apexrl.learner.best import KIND as BEST

    config = cfg.parse(cfg.EvalConfig, argv, "eval", "apexrl eval")
    path = Path(config.checkpoint)
    if path.is_dir():
        kinds = ["learner"] if config.latest else [BEST, "learner"]
        found = next(filter(None, (checkpoint.load_newest(path, k) for k in kinds)), None)
        if found is None:
            sys.exit(f"apexrl eval: no valid checkpoint ({' or '.join(kinds)}) in {path}")
        path, meta, arrays = found
    else:
        kind = BEST if path.name.startswith(f"{BEST}-") else "learner"
        meta, arrays = checkpoint.read_checkpoint(path, kind)
    saved = {"algorithm": "dqn"} | meta["config"]  # checkpoints from before the algorithm layer
    agent = cfg.AgentConfig(
        **{f.name: saved[f.name] for f in dataclasses.fields(cfg.AgentConfig) if f.name in saved}
    )
    policy = algorithms.make(agent).policy()
    policy.load(prefixed(arrays, "online"))
    options = EnvOptions.of(agent)
    returns = evaluate(policy, agent.env, config.episodes, config.seed, config.epsilon, options)
    what = f"{path}: {agent.env}, version {meta['version']} (update {meta['update_step']})"
    if "mean_return" in meta:  # a best model: say what earned it
        p = meta["protocol"]
        what += (f", the best model: scored {meta['mean_return']:.1f} over {p['episodes']}"
                 f" evaluator episodes (seeds {p['first_seed']}..)")  # fmt: skip
    print(what)
    print(f"seeds {config.seed}..{config.seed + config.episodes - 1}, epsilon {config.epsilon:g}")
    print("returns: " + " ".join(f"{r:g}" for r in returns))
    print(
        f"mean {returns.mean():.1f}, min {returns.min():g}, max {returns.max():g} over {len(returns)} episodes"
    )
    return 0
