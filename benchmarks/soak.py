"""Soak with a nemesis: local mode on CartPole while faults hit its services, then a checker
that proves from recorded histories that nothing acknowledged was lost.

    .venv/bin/python benchmarks/soak.py                                     # 60 minutes
    .venv/bin/python -m pytest tests/e2e/test_soak.py    # 10 minutes, the last 5 quiet (CI)

The services are local mode's (`apexrl.Run`: the same processes, config file and
ports), with replay and learner checkpoints on, under a supervisor that restarts any that
dies, as Kubernetes would. The flags follow gRPC's soak tests: an iteration is one fault and
the recovery after it; `--soak-per-iteration-max-acceptable-latency-ms` bounds the recovery;
`--soak-max-failures` iterations may fail it; `--soak-overall-timeout-seconds` ends the run.

After a warm-up (until the soak's own evaluation finds CartPole solved), the nemesis waits a
random `--nemesis-interval` (60-180 s), then picks a fault and a target at random:
- kill: SIGKILL to a replay shard, the learner, an actor or the evaluator;
- pause: SIGSTOP for 10-30 s, then SIGCONT;
- partition (root with `ip` and `nft`): the whole run lives in a network namespace of its own;
  every packet to and from a replay shard's or the learner's gRPC port is dropped for 10-30 s.
An iteration has recovered when every service answers its metrics endpoint, the learner has
made updates since, a witness insert has been acknowledged by every shard, and, after the
learner was killed, the new learner's parameters solve CartPole (below).

What the checker reads, none of it the services' own counters or log lines:
- witness.jsonl: a witness writer inserts one CartPole transition (a random-policy env step)
  into every shard every `--witness-interval` s and records each one whose insert was
  acknowledged, with its bytes. A replay's contents are read from its checkpoint files: the
  one restored after each kill (read before the restart) and the final one (written on
  SIGTERM at the end). In each, the acknowledged rows present must be one contiguous run of
  the acknowledged sequence: rows missing before it were evicted by FIFO (only if the table
  was full), rows missing after it were acknowledged after that checkpoint and lost with the
  killed process, no earlier than `--replay-checkpoint-interval` + the longest pause + 15 s
  before the kill. The final table must end with the last acknowledged row.
- parameters: the learner's served (lineage, version) every second: within a lineage the
  version never decreases; a restarted learner starts at least at the version of the newest
  learner checkpoint on disk when it was killed.
- best models: every `best-*.ckpt` the learner writes; their mean returns never decrease.
- solved: the served parameters played greedily by this process (10 episodes, fresh seeds,
  the algorithm's evaluation policy): after every learner restart, the new lineage's reach
  the env's threshold.
- resources: VmRSS, threads and open fds of each service process from /proc every second on
  average (at random times: a fixed period can lock onto a process's own periodic work); the
  least-squares slope after `--warmup-seconds` of each process's life, over windows at least
  `--resource-min-window` s long, must be under 1 MB (RSS) and 1 (threads, fds) per 10 min.
  The slope is fitted to the level, each sample taken as the median of those within 15 s of
  it: a leak raises the level, while a sample that meets a transient (a replay's checkpoint
  copy, the table's size for well under a second; a learner's batches and messages, a few MB
  that come and go) would read as growth near the window's end. The median, not the lowest:
  the lowest of a few dozen samples of a process's churning heap is one extreme draw, and
  wanders as much as the slope's limit over a few minutes.
  The samples are those at rest: none from a fault's start until it has recovered and every
  actor's insert backlog has landed (an actor holds up to 100K transitions while replay is
  away; a learner's streams to a replay that is away end, and their threads with them), and
  a replay's only once its table is full (a filling table grows by design). With
  `--quiet-seconds` the nemesis stops that long before the end, and the slopes are taken from
  the quiet part alone: a short run's window then holds no step a fault leaves behind.

stdout: one JSON object (iterations, failures, every check with its figures); exit status 1
when a check fails or more iterations than --soak-max-failures did not recover in time.
"""

import argparse
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

from apexrl.algorithms.envs import default_target
from apexrl.common import checkpoint as generic
from apexrl.common.learner_client import LearnerClient
from apexrl.local.settings import parse
from apexrl.local.supervision import Child, Run, die_with_parent
from apexrl.replay import checkpoint as replay_checkpoint
from apexrl.replay.client import ReplayClient
from apexrl.replay.signature import parse_signature

PARTITION_TABLE = "apexrl_soak"
MB = 1 << 20
LEVEL_S = 15.0  # s: the resource slopes fit the median of each sample's neighbours within it
LANDED = 1000  # transitions an actor may buffer at rest: its batches in flight (2 of 64)


def log(*args) -> None:
    print(time.strftime("%H:%M:%S"), *args, file=sys.stderr, flush=True)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--soak-iterations", type=int, default=1000, help="faults to inject at most")
    p.add_argument("--soak-max-failures", type=int, default=0,
                   help="iterations that may miss the latency limit")  # fmt: skip
    p.add_argument("--soak-per-iteration-max-acceptable-latency-ms", type=int, default=180_000,
                   help="longest recovery after a fault's end")  # fmt: skip
    p.add_argument("--soak-overall-timeout-seconds", type=float, default=3600)
    p.add_argument("--quiet-seconds", type=float, default=0.0,
                   help="the run's last seconds have no faults; when > 0 the resource slopes"
                   " are taken from them alone (after the last fault has recovered)")  # fmt: skip
    p.add_argument(
        "--nemesis-interval", type=float, nargs=2, default=(60, 180), metavar=("MIN", "MAX")
    )
    p.add_argument("--pause-seconds", type=float, nargs=2, default=(10, 30), metavar=("MIN", "MAX"))
    p.add_argument("--faults", default="kill,pause,partition",
                   help="comma-separated: kill, pause, partition (partition needs root)")  # fmt: skip
    p.add_argument("--script", default="",
                   help="faults to inject first, in order, as FAULT:SERVICE (kill:learner,"
                   "pause:replay,...), then random ones")  # fmt: skip
    p.add_argument("--algorithm", default="dqn")
    p.add_argument("--env", default="CartPole-v1")
    p.add_argument("--actors", type=int, default=2)
    p.add_argument("--replay-shards", type=int, default=1)
    p.add_argument("--replay-checkpoint-interval", type=float, default=10.0)
    p.add_argument("--learner-checkpoint-interval", type=float, default=10.0)
    p.add_argument("--witness-interval", type=float, default=0.2)
    p.add_argument("--warmup-seconds", type=float, default=120.0,
                   help="of each process's life, left out of the resource slopes")  # fmt: skip
    p.add_argument("--resource-min-window", type=float, default=300.0)
    p.add_argument("--run-dir", default="")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--netns", default="", help=argparse.SUPPRESS)  # set when re-run inside one
    return p.parse_args(argv)


# --- the services under a supervisor -------------------------------------------------------


class SoakRun(Run):
    """Local mode's processes, each replay shard checkpointing into its own directory."""

    def shard_flags(self, shard: int) -> list[str]:
        return [*super().shard_flags(shard), "--checkpoint-dir", str(self.replay_dir(shard))]

    def replay_dir(self, shard: int) -> Path:
        return self.run_dir / "replay-checkpoints" / f"shard-{shard}"


class Supervisor:
    """Restarts every child that exits, like a Deployment's controller; records each restart
    with what the restarted process will resume from (read before it starts)."""

    def __init__(self, run: SoakRun, history: "History"):
        self.run, self.history = run, history
        self.stopping = threading.Event()
        self.lock = threading.Lock()  # held while a child is being replaced
        self.thread = threading.Thread(target=self._loop, name="supervisor", daemon=True)

    def _loop(self) -> None:
        while not self.stopping.wait(0.2):
            for child in list(self.run.children):
                if child.process.poll() is not None and not self.stopping.is_set():
                    with self.lock:
                        try:
                            self.restart(child)
                        except RuntimeError as err:  # died while starting: next round
                            log(f"restarting {child.name} failed: {err}")

    def restart(self, child: Child) -> None:
        died = time.time()
        resumes = self.resume_point(child.name)
        child.ready_file.unlink(missing_ok=True)
        with open(self.run.run_dir / "logs" / f"{child.name}.log", "a") as log_file:
            child.process = subprocess.Popen(
                child.process.args, stdout=log_file, stderr=subprocess.STDOUT,
                preexec_fn=die_with_parent,
            )  # fmt: skip
        self.run.wait_ready([child])
        self.history.add("restarts", name=child.name, died=died, served=time.time(), **resumes)
        log(f"restarted {child.name} (pid {child.process.pid})")

    def resume_point(self, name: str) -> dict:
        if name.startswith("replay"):
            shard = int(name.split("-")[1]) if "-" in name else 0
            found = replay_checkpoint.load_newest(self.run.replay_dir(shard))
            if found is None:
                return {"shard": shard, "rows": [], "full": False, "checkpoint": None}
            path, states = found
            return {"shard": shard, "checkpoint": str(path),
                    **table_rows(states[0], self.history.sent_rows)}  # fmt: skip
        if name == "learner":
            found = generic.load_newest(self.run.checkpoint_dir, "learner")
            return {"checkpoint_version": found[1]["version"] if found else 0}
        return {}


def table_rows(state, among: set[str]) -> dict:
    """Which of the rows `among` (bytes, hex) a table state holds, and whether it is full."""
    live = np.flatnonzero(state.slot_keys[: state.used] >= 0)
    names = [spec.name for spec in state.signature]
    rows = set(row_bytes(state.columns, names, live)) & among
    return {"rows": sorted(rows), "full": state.size >= state.capacity}


def row_bytes(columns: dict, names: list[str], rows: np.ndarray | None = None) -> list[str]:
    """Each row's bytes over the named columns, hex: what identifies a witness row."""
    parts = []
    for name in names:
        column = np.ascontiguousarray(columns[name] if rows is None else columns[name][rows])
        parts.append(column.reshape(len(column), -1).view(np.uint8))
    return [row.tobytes().hex() for row in np.concatenate(parts, axis=1)]


class History:
    """What the checker reads: appended to by the soak's threads, saved as JSON lines."""

    def __init__(self, run_dir: Path):
        self.lock = threading.Lock()
        self.records: dict[str, list[dict]] = {}
        self.run_dir = run_dir
        self.sent_rows: set[str] = set()  # every witness row, before its insert is sent

    def add(self, kind: str, **record) -> None:
        with self.lock:
            self.records.setdefault(kind, []).append(record)
            with open(self.run_dir / f"{kind}.jsonl", "a") as f:
                f.write(json.dumps(record) + "\n")

    def get(self, kind: str) -> list[dict]:
        with self.lock:
            return list(self.records.get(kind, []))


# --- the observers ---------------------------------------------------------------------------


class RandomSteps:
    """Random-policy env steps as one-row transitions of the table's columns."""

    def __init__(self, env_id: str, specs, seed: int):
        import gymnasium as gym

        self.env, self.specs = gym.make(env_id), specs
        self.rng = np.random.default_rng(seed)
        self.obs = None

    def __call__(self) -> dict[str, np.ndarray]:
        if self.obs is None:
            self.obs, _ = self.env.reset(seed=int(self.rng.integers(2**31)))
        action = int(self.rng.integers(2))
        next_obs, reward, terminated, truncated, _ = self.env.step(action)
        values = {"obs": self.obs, "action": action, "reward": reward,
                  "discount": 0.0 if terminated else 0.99, "next_obs": next_obs}  # fmt: skip
        self.obs = None if terminated or truncated else next_obs
        return {
            s.name: np.asarray(values[s.name], s.dtype).reshape(1, *s.shape) for s in self.specs
        }


def witness(run: SoakRun, history: History, stop: threading.Event, interval: float) -> None:
    table = run.settings["replay"]["tables"][0]
    specs = parse_signature(table["signature"])
    missing = {"obs", "action", "reward", "discount", "next_obs"} ^ {s.name for s in specs}
    if missing:
        raise ValueError(f"--algorithm: the witness writes n-step transitions, not {missing}")
    names = [s.name for s in specs]
    steps = RandomSteps(run.config.env, specs, seed=10**6)
    replays = [c for c in run.children if c.name.startswith("replay")]
    clients = [ReplayClient(f"127.0.0.1:{c.ports['port']}", table=table["name"], timeout=5,
                            retry_seconds=0) for c in replays]  # fmt: skip
    while not stop.wait(interval):
        for shard, client in enumerate(clients):
            row, sent = steps(), time.time()
            key = row_bytes(row, names)[0]
            history.sent_rows.add(key)
            try:
                client.insert(row)
            except Exception:  # noqa: BLE001 - not acknowledged: the checker ignores it
                continue
            history.add("witness", shard=shard, sent=sent, acked=time.time(), row=key)
    for client in clients:
        client.close()


def watch(run: SoakRun, history: History, stop: threading.Event) -> None:
    """Served parameters every second, best models as they appear."""
    learner = next(c for c in run.children if c.name == "learner")
    seen_best: set[str] = set()
    with LearnerClient(f"127.0.0.1:{learner.ports['port']}", timeout=3) as client:
        while not stop.wait(1.0):
            try:
                p = client.get_parameters(have_version=0)
                history.add("parameters", t=time.time(), lineage=p.lineage, version=p.version,
                            update_step=p.update_step)  # fmt: skip
            except Exception:  # noqa: BLE001 - away (killed, paused, cut off): recorded as a gap
                pass
            for _, path in generic.checkpoints(run.checkpoint_dir, "best"):
                if path.name not in seen_best:
                    try:
                        meta, _ = generic.read_checkpoint(path, "best")
                    except (OSError, generic.CorruptCheckpoint):
                        continue  # pruned meanwhile
                    seen_best.add(path.name)
                    history.add("best", file=path.name, mean_return=meta["mean_return"],
                                version=meta["version"])  # fmt: skip


def sample_resources(run: SoakRun, history: History, stop: threading.Event, seed: int) -> None:
    """Every process's /proc figures every second on average, at random times 0.5-1.5 s apart:
    a fixed period locks onto a process's own periodic work (a replay's checkpoint every 5 s)
    and can read its transient sample after sample for minutes."""
    rng = random.Random(seed)
    while not stop.wait(rng.uniform(0.5, 1.5)):
        t = time.time()
        for child in run.children:
            sample = proc_sample(child.process.pid)
            if sample and child.name.startswith("replay"):
                sample["full"] = table_full(child)
            if sample:
                history.add("resources", name=child.name, pid=child.process.pid, t=t, **sample)


def table_full(child: Child) -> bool:
    try:
        metrics = child.metrics()
    except OSError:
        return False
    return metrics.get("apexrl_replay_size", 0) >= metrics.get("apexrl_replay_capacity", 1)


def proc_sample(pid: int) -> dict | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    if "VmRSS" not in fields or fields["State"].strip().startswith(("Z", "T")):
        return None  # exiting, exited or paused
    kb = {key: int(fields[key].split()[0]) * 1024 for key in ("VmRSS", "RssAnon", "RssFile")}
    # rss (VmRSS) is what the slopes use; its anonymous and file-backed parts tell a heap that
    # grows from code pages touched for the first time (a path first taken after a fault).
    return {"rss": kb["VmRSS"], "rss_anon": kb["RssAnon"], "rss_file": kb["RssFile"],
            "threads": int(fields["Threads"]), "fds": fds}  # fmt: skip


# --- the nemesis ------------------------------------------------------------------------------


class Nemesis:
    """One fault at a time on a random target; each ends before the recovery is measured."""

    def __init__(self, run: SoakRun, supervisor: Supervisor, args, rng: random.Random):
        self.run, self.supervisor, self.args, self.rng = run, supervisor, args, rng
        self.paused: Child | None = None
        self.cut = False

    def targets(self, fault: str) -> list[Child]:
        if fault == "partition":  # servers: their ports identify all their traffic
            return [c for c in self.run.children if c.name.startswith(("replay", "learner"))]
        return list(self.run.children)

    def inject(self, fault: str, child: Child) -> dict:
        """Applies the fault and ends it; returns what was done, `ended` its end (unix)."""
        if fault == "kill":
            with self.supervisor.lock:  # restarted by the supervisor once this is released
                child.process.send_signal(signal.SIGKILL)
                child.process.wait(30)
            ended = time.time()
            while child.process.poll() is not None or not child.ready_file.exists():
                time.sleep(0.1)
            return {"ended": ended}
        seconds = self.rng.uniform(*self.args.pause_seconds)
        if fault == "pause":
            self.paused = child
            child.process.send_signal(signal.SIGSTOP)
            time.sleep(seconds)
            child.process.send_signal(signal.SIGCONT)
            self.paused = None
        else:
            port = child.ports["port"]
            self.cut = True
            nft("-f", "-", input=f"""
table inet {PARTITION_TABLE} {{
    chain input {{
        type filter hook input priority filter; policy accept;
        tcp dport {port} counter drop
        tcp sport {port} counter drop
    }}
}}
""")  # fmt: skip
            time.sleep(seconds)
            self.heal()
        return {"ended": time.time(), "seconds": round(seconds, 1)}

    def heal(self) -> None:
        if self.cut:
            nft("delete", "table", "inet", PARTITION_TABLE)
            self.cut = False
        if self.paused is not None:
            self.paused.process.send_signal(signal.SIGCONT)
            self.paused = None


def nft(*args: str, input: str | None = None) -> None:
    subprocess.run(["nft", *args], input=input, text=True, check=True, timeout=30)


def netns_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "network namespaces need root"
    missing = [tool for tool in ("ip", "nft") if shutil.which(tool) is None]
    return f"{' and '.join(missing)} not installed" if missing else None


def in_own_netns(argv: list[str]) -> int:
    """Runs this script again inside a network namespace of its own (loopback only), so that
    its nftables rules touch nothing else."""
    name = f"apexrl-soak-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        inner = [sys.executable, str(Path(__file__).resolve()), *argv, "--netns", name]
        child = subprocess.Popen(["ip", "netns", "exec", name, *inner])
        signal.signal(signal.SIGTERM, lambda *_: child.send_signal(signal.SIGTERM))
        return child.wait()
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


class Judge:
    """Whether the run has recovered from a fault, from the histories (and its own games)."""

    def __init__(self, run: SoakRun, history: History, args):
        from apexrl import algorithms

        self.run, self.history, self.args = run, history, args
        self.policy = algorithms.make(run.config).policy()
        self.target = default_target(run.config.env)
        learner = next(c for c in run.children if c.name == "learner")
        self.learner = LearnerClient(f"127.0.0.1:{learner.ports['port']}", timeout=10)
        self.seed = 10**7

    def solved(self) -> tuple[bool, float, int]:
        """(solved, mean return, lineage) of the served parameters, 10 fresh episodes."""
        from apexrl.algorithms.envs import EnvOptions
        from apexrl.algorithms.evaluation import evaluate

        try:
            params = self.learner.get_parameters()
        except Exception:  # noqa: BLE001 - away for now: not solved yet
            return False, math.nan, 0
        self.policy.load(params.arrays)
        config = self.run.config
        returns = evaluate(self.policy, config.env, 10, self.seed, 0.0, EnvOptions.of(config))
        self.seed += 10
        return bool(returns.mean() >= self.target), float(returns.mean()), params.lineage

    def serving(self, since: float) -> bool:
        """Every service answers, the learner has updated and every shard acknowledged."""
        for child in self.run.children:
            try:
                child.metrics()
            except OSError:
                return False
        steps = [p["update_step"] for p in self.history.get("parameters") if p["t"] > since]
        shards = {w["shard"] for w in self.history.get("witness") if w["acked"] > since}
        return len(set(steps)) > 1 and len(shards) == self.args.replay_shards

    def settle(self, deadline: float) -> bool:
        """Waits until every actor's insert backlog has landed (what it buffers is back to the
        batches in flight); False if that did not happen before the deadline."""
        actors = [c for c in self.run.children if c.name.startswith("actor")]
        while time.time() < deadline:
            try:
                buffered = [c.metrics().get("apexrl_actor_transitions_buffered", 0) for c in actors]
            except OSError:  # an actor restarting: it holds nothing yet
                buffered = [math.inf]
            if max(buffered, default=0) <= LANDED:
                return True
            time.sleep(1.0)
        return False

    def recover(self, since: float, learner_restarted: bool, deadline: float) -> dict:
        while time.time() < deadline:
            if self.serving(since):
                break
            time.sleep(1.0)
        else:
            return {"recovered": False, "why": "services not serving"}
        games = []
        while learner_restarted and time.time() < deadline:
            ok, mean, lineage = self.solved()
            games.append({"mean_return": round(mean, 1), "lineage": lineage})
            if ok:
                break
            time.sleep(5.0)
        else:
            if learner_restarted:
                return {"recovered": False, "why": "not solved again", "games": games}
        return {"recovered": True, "latency_s": round(time.time() - since, 1), "games": games}


# --- the checker ------------------------------------------------------------------------------


def check_replay(shard: int, history: History, final: dict, window: float) -> dict:
    """Every acknowledged witness row is in each table read back, was evicted by FIFO (oldest
    first, from a full table) or was lost with a killed process within `window` s of its
    kill (acknowledged after the checkpoint that process was restored from)."""
    # By the time the insert was sent: one sent before a kill can only have been acknowledged
    # by the process killed (the next one starts after it).
    acked = [(w["sent"], w["row"]) for w in history.get("witness") if w["shard"] == shard]
    reads = [(r["died"], r, f"restart after the kill at {r['died']:.0f}")
             for r in history.get("restarts") if r.get("shard") == shard]  # fmt: skip
    reads.append((math.inf, final, "final"))
    lost: set[str] = set()
    problems, windows = [], []
    for died, read, what in reads:
        rows = set(read["rows"])
        sequence = [(t, row) for t, row in acked if t < died and row not in lost]
        present = [i for i, (_, row) in enumerate(sequence) if row in rows]
        lo, hi = (present[0], present[-1]) if present else (0, -1)
        if hi - lo + 1 != len(present):
            problems.append(f"{what}: {hi - lo + 1 - len(present)} acknowledged rows missing"
                            " between present ones")  # fmt: skip
        if lo > 0 and not read["full"]:
            problems.append(f"{what}: the {lo} oldest acknowledged rows missing, table not full")
        tail = sequence[hi + 1 :]
        if tail and what == "final":
            problems.append(f"final: the {len(tail)} newest acknowledged rows missing")
        elif tail:
            windows.append(died - tail[0][0])
            if windows[-1] > window:
                problems.append(f"{what}: rows acknowledged {windows[-1]:.1f} s before the kill"
                                f" lost (more than {window:.0f} s)")  # fmt: skip
        lost |= {row for _, row in tail}
    return {
        "acknowledged": len(acked),
        "in_final_table": len(set(final["rows"]) & {row for _, row in acked}),
        "lost_with_a_killed_process": len(lost),
        "longest_loss_window_s": round(max(windows, default=0.0), 1),
        "tables_read": len(reads),
        "problems": problems,
    }


def check_versions(history: History) -> dict:
    """Within a lineage versions never decrease; a restarted learner starts at least at the
    version of the newest checkpoint on disk when it was killed."""
    problems, first_seen, last, order = [], {}, {}, []
    for p in history.get("parameters"):
        lineage = p["lineage"]
        if lineage not in first_seen:
            if order and lineage != order[-1] and lineage in order:
                problems.append(f"lineage {lineage} served again after another")
            first_seen[lineage] = p
            order.append(lineage)
        elif p["version"] < last[lineage]:
            problems.append(f"lineage {lineage}: version {last[lineage]} then {p['version']}")
        last[lineage] = p["version"]
    restarts = [r for r in history.get("restarts") if "checkpoint_version" in r]
    reissued = []
    for previous, lineage in zip(order, order[1:], strict=False):
        first = first_seen[lineage]
        before = [r for r in restarts if r["served"] <= first["t"]]
        floor = before[-1]["checkpoint_version"] if before else 0
        if first["version"] < floor:
            problems.append(f"lineage {lineage} started at version {first['version']} below"
                            f" its checkpoint's {floor}")  # fmt: skip
        reissued.append(max(0, last[previous] - first["version"]))
    return {"lineages": len(order), "newest_version": max(last.values(), default=0),
            "most_versions_reissued": max(reissued, default=0), "problems": problems}  # fmt: skip


def check_best(history: History) -> dict:
    best = sorted(history.get("best"), key=lambda b: b["file"])
    returns = [b["mean_return"] for b in best]
    worse = [f"{b['file']}: {b['mean_return']} after {a['mean_return']}"
             for a, b in zip(best, best[1:], strict=False) if b["mean_return"] < a["mean_return"]]  # fmt: skip
    return {"best_models": len(best), "mean_returns": returns, "problems": worse}


def slope_per_10_min(points: list[tuple[float, float]]) -> float:
    t = np.array([p[0] for p in points])
    y = np.array([p[1] for p in points], dtype=np.float64)
    return float(np.polyfit(t - t[0], y, 1)[0] * 600)


def level_points(samples: list[dict], key: str, scale: float) -> list[tuple[float, float]]:
    """Each sample of `key` as the median of those within LEVEL_S of it, where the samples reach
    that far on both sides: what a process holds through its transient peaks (a replay's
    checkpoint copy lives well under a second) and its heap's churn."""
    t = np.array([s["t"] for s in samples])
    y = np.array([s[key] / scale for s in samples], dtype=np.float64)
    inner = t[(t >= t[0] + LEVEL_S) & (t <= t[-1] - LEVEL_S)]
    starts = np.searchsorted(t, inner - LEVEL_S, "left")  # the samples are in time order
    ends = np.searchsorted(t, inner + LEVEL_S, "right")
    return [(ti, float(np.median(y[a:b]))) for ti, a, b in zip(inner, starts, ends, strict=True)]


def check_resources(history: History, warmup: float, min_window: float, since: float = 0.0) -> dict:
    """Least-squares slopes per 10 minutes of each process's RSS (MB), threads and fds at
    rest (see the module's doc), after its first `warmup` s and after `since` (unix time),
    where at least `min_window` s of samples remain, fitted to their level (`level_points`)."""
    by_process: dict[tuple, list[dict]] = {}
    for r in history.get("resources"):
        by_process.setdefault((r["name"], r["pid"]), []).append(r)
    faults = [(f["start"], f["end"]) for f in history.get("faults")]
    slopes, problems = {}, []
    # RSS's anonymous and file-backed parts are reported beside it, not judged (None).
    limits = {"rss": 1.0, "threads": 1.0, "fds": 1.0, "rss_anon": None, "rss_file": None}
    for (name, pid), samples in sorted(by_process.items()):
        kept = [s for s in samples if s["t"] - samples[0]["t"] >= warmup and s.get("full", True)
                and s["t"] >= since
                and not any(start <= s["t"] <= end for start, end in faults)]  # fmt: skip
        if len(kept) < 3 or kept[-1]["t"] - kept[0]["t"] < min_window:
            continue
        figures = {}
        for key, limit in limits.items():
            if limit is None and not all(key in s for s in kept):
                continue
            scale = MB if key.startswith("rss") else 1
            figures[key] = round(slope_per_10_min(level_points(kept, key, scale)), 3)
            if limit is not None and figures[key] >= limit:
                problems.append(f"{name} (pid {pid}): {key} slope {figures[key]} per 10 min")
        figures["minutes"] = round((kept[-1]["t"] - kept[0]["t"]) / 60, 1)
        figures["samples"] = len(kept)
        slopes[f"{name}/{pid}"] = figures
    return {"measured": slopes, "problems": problems}


# --- the run --------------------------------------------------------------------------------


def soak(args, run: SoakRun, history: History, judge: Judge, nemesis: Nemesis, stop) -> dict:
    started = time.time()
    deadline = started + args.soak_overall_timeout_seconds
    faults_end = deadline - args.quiet_seconds  # no fault starts after this
    faults = args.fault_list
    script = list(args.script_steps)
    while time.time() < deadline and not stop.is_set():  # warm-up: solved before any fault
        ok, mean, _ = judge.solved()
        if ok:
            break
        stop.wait(5.0)
    warmup = time.time() - started
    log(f"warm-up: {'solved' if ok else 'not solved'} after {warmup:.0f} s (mean {mean:.1f})")
    iterations = []
    rng = nemesis.rng
    limit = args.soak_per_iteration_max_acceptable_latency_ms / 1000
    while len(iterations) < args.soak_iterations and ok:
        wait = min(rng.uniform(*args.nemesis_interval), faults_end - time.time())
        if stop.wait(max(0.0, wait)) or time.time() >= faults_end:
            break
        if script:
            fault, name = script.pop(0)
            child = next(c for c in run.children if c.name == name)
        else:
            fault = rng.choice(faults)
            child = rng.choice(nemesis.targets(fault))
        log(f"iteration {len(iterations) + 1}: {fault} {child.name}")
        record = {"fault": fault, "target": child.name, "at": round(time.time() - started, 1)}
        record.update(nemesis.inject(fault, child))
        restarted = fault == "kill" and child.name == "learner"
        record.update(judge.recover(record["ended"], restarted, record["ended"] + limit))
        if record["recovered"]:
            record["backlogs_landed_s"] = (
                round(time.time() - record["ended"], 1)
                if judge.settle(record["ended"] + limit)
                else None
            )
        history.add("faults", start=started + record["at"], end=time.time())
        record.pop("ended")
        iterations.append(record)
        log(f"iteration {len(iterations)}: {record}")
    quiet = args.quiet_seconds > 0
    quiet_from = max([started] + [f["end"] for f in history.get("faults")])
    if quiet and ok:
        log(f"quiet from {quiet_from - started:.0f} s to the end")
        stop.wait(max(0.0, deadline - time.time()))
    return {"warmup_s": round(warmup, 1), "solved_before_faults": ok, "iterations": iterations,
            "quiet_from_s": round(quiet_from - started, 1) if quiet else None,
            "quiet_since": quiet_from if quiet else 0.0,
            "seconds": round(time.time() - started, 1)}  # fmt: skip


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    args.fault_list = [f for f in args.faults.split(",") if f]
    unknown = set(args.fault_list) - {"kill", "pause", "partition"}
    if unknown or not args.fault_list:
        sys.exit(f"--faults: unknown {sorted(unknown)} (kill, pause, partition)")
    skipped = None
    if "partition" in args.fault_list and not args.netns:
        skipped = netns_unavailable()
        if skipped is None:
            return in_own_netns(argv)
        args.fault_list.remove("partition")
        log(f"partition left out: {skipped}")
    shards = args.replay_shards
    names = {"learner", "evaluator", *(f"actor-{i}" for i in range(args.actors))}
    names |= {"replay"} if shards == 1 else {f"replay-{i}" for i in range(shards)}
    args.script_steps = [tuple(step.split(":", 1)) for step in args.script.split(",") if step]
    for step in args.script_steps:
        if len(step) != 2 or step[0] not in args.fault_list or step[1] not in names:
            sys.exit(f"--script: {':'.join(step)} is not FAULT:SERVICE with a fault of"
                     f" --faults and a service of {sorted(names)}")  # fmt: skip
    run_dir = Path(args.run_dir or f"runs/soak-{time.strftime('%Y%m%d-%H%M%S')}")
    config = parse(["--algorithm", args.algorithm, "--env", args.env, "--actors",
                          str(args.actors), "--replay-shards", str(args.replay_shards),
                          "--run-dir", str(run_dir)])  # fmt: skip
    user = {"replay": {"checkpoint_interval": args.replay_checkpoint_interval},
            "learner": {"checkpoint_interval": args.learner_checkpoint_interval}}  # fmt: skip
    run = SoakRun(config, user, run_dir)
    history = History(run_dir)
    stop, observers_stop = threading.Event(), threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    run.start_all()
    run.start_evaluator()  # once the others serve, as local mode starts it
    run.wait_ready([run.evaluator])
    supervisor = Supervisor(run, history)
    nemesis = Nemesis(run, supervisor, args, random.Random(args.seed))
    observers = [
        threading.Thread(
            target=witness, args=(run, history, observers_stop, args.witness_interval)
        ),
        threading.Thread(target=watch, args=(run, history, observers_stop)),
        threading.Thread(target=sample_resources, args=(run, history, observers_stop, args.seed)),
    ]
    try:
        supervisor.thread.start()
        for thread in observers:
            thread.start()
        report = soak(args, run, history, Judge(run, history, args), nemesis, stop)
    finally:
        nemesis.heal()
        observers_stop.set()
        for thread in observers:
            thread.join(30)
        supervisor.stopping.set()
        supervisor.thread.join(30)
        run.stop_all()
    window = args.replay_checkpoint_interval + args.pause_seconds[1] + 15
    checks = {}
    for shard in range(args.replay_shards):
        found = replay_checkpoint.load_newest(run.replay_dir(shard))
        final = {"rows": [], "full": False}
        if found:
            final = table_rows(found[1][0], history.sent_rows)
        checks[f"replay-{shard}"] = check_replay(shard, history, final, window)
    checks["versions"] = check_versions(history)
    checks["best"] = check_best(history)
    checks["resources"] = check_resources(history, args.warmup_seconds, args.resource_min_window,
                                          report.pop("quiet_since"))  # fmt: skip
    late = [i for i in report["iterations"] if not i["recovered"]]
    report.update(
        checks=checks,
        failed_iterations=len(late),
        partition=f"left out: {skipped}"
        if skipped
        else "on"
        if "partition" in args.fault_list
        else "off",
        run_dir=str(run_dir),
        settings={k: v for k, v in vars(args).items() if k != "netns"},
    )
    problems = [p for c in checks.values() for p in c["problems"]]
    ok = report["solved_before_faults"] and not problems and len(late) <= args.soak_max_failures
    report["passed"] = ok
    print(json.dumps(report))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
