"""Crash at any byte: kill -9 the replay and the learner inside checkpoint writes, then restart
them and compare what they restored with what was saved.

    .venv/bin/python benchmarks/checkpoint_crash.py                        # every part
    .venv/bin/python benchmarks/checkpoint_crash.py --parts replay-points replay-random
    .venv/bin/python benchmarks/checkpoint_crash.py --parts damage --damage-trials 400

Parts (each trial is one process killed, then restarted and checked):

- replay-points: a chain of `apexrl replay` processes. Each one restores from the checkpoint
  directory, is checked, serves an insert and a sample, takes `--batch` more inserts, then
  checkpoints with APEXRL_CHECKPOINT_KILL_AT=N (services/common/checkpoint.py): it kills
  itself with SIGKILL at the Nth crash point of that write, a crash point lying before every
  file operation (create, each write, fsync, close, rename, directory fsync, each prune) and
  after the last. N takes the values 1, 2, ... until a write survives, `--rounds` times over.
- replay-random: the same chain with `--random-items` items in the table, killed from outside
  by SIGKILL after a random delay in [0, 1.5 x the measured duration of a checkpoint call].
- learner-points / learner-random: a chain of `apexrl learner` processes training on a
  replay process that holds 2,000 CartPole transitions. Each crash process resumes, trains
  20 updates (--max-updates), has the parameters it serves recorded and is sent SIGTERM,
  which checkpoints: killed there at crash point N (every `--learner-stride`-th point), or by
  SIGKILL after a random delay in [0, 1.5 x a SIGTERM-to-exit time]. A verify process then
  resumes with --max-updates at the older step (so it does not train) and the parameters
  it serves are compared with both candidates.
- damage: the newest of two replay checkpoints cut at a random byte or with one random bit
  flipped; `replay.checkpoint.load_newest` must refuse it, naming the file, and return the
  previous one; every `--server-every`th trial also through a restarted replay process.

A restored state must be exactly the previous complete checkpoint ("previous") or the one
being written ("new"): table digests (Info include_digest) for the replay; update step and
every parameter array for the learner. After each crash, every `<kind>-*.ckpt` file must
read back whole (no torn file under a final name). stdout: one JSON object with the trials,
the outcomes per part and every failure; exit status 1 on any failure.
"""

import argparse
import json
import logging
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np

from apexrl.common import checkpoint as generic
from apexrl.common.checkpoint import KILL_AT_ENV, CorruptCheckpoint
from apexrl.common.learner_client import LearnerClient
from apexrl.replay import checkpoint as replay_checkpoint
from apexrl.replay.client import ReplayClient
from apexrl.v1 import replay_pb2

LEARNER_UPDATES = 20  # per crash process: a multiple of the publish interval (10)


def log(*args) -> None:
    print(*args, file=sys.stderr, flush=True)


def transitions(n: int, start: int, obs_dim: int = 4) -> dict[str, np.ndarray]:
    """CartPole-shaped rows whose values encode their insertion index."""
    index = np.arange(start, start + n)
    obs = (index[:, None] + np.arange(obs_dim)[None, :] / 100).astype(np.float32)
    return {
        "obs": obs,
        "action": (index % 2).astype(np.int64),
        "reward": np.ones(n, np.float32),
        "discount": np.full(n, 0.99, np.float32),
        "next_obs": obs + 1,
    }


class Service:
    """`apexrl <command>` as a child process on loopback, ports from its ready file."""

    def __init__(self, workdir: Path, command: str, flags: list[str], kill_at: int = 0):
        stamp = time.monotonic_ns()
        ready = workdir / f"ready-{stamp}.json"
        self.log_path = workdir / f"{command}-{stamp}.log"
        env = {k: v for k, v in os.environ.items() if k != KILL_AT_ENV}
        if kill_at:
            env[KILL_AT_ENV] = str(kill_at)
        args = [sys.executable, "-m", "apexrl.cli", command, "--host", "127.0.0.1", "--port",
                "0", "--metrics-port", "0", "--ready-file", str(ready), "--log-level",
                "WARNING", *flags]  # fmt: skip
        with open(self.log_path, "w") as out:
            self.process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 120
        while not ready.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"{command} did not start:\n{self.log_path.read_text()}")
            time.sleep(0.02)
        self.address = f"127.0.0.1:{json.loads(ready.read_text())['port']}"

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(30)


def digest(client: ReplayClient) -> str:
    # wait_for_ready: on a loaded machine a fresh server may miss the clients' short connect
    # timeout (grpc.min_reconnect_backoff_ms, common/backoff.py), which fails a call at once.
    request = replay_pb2.InfoRequest(include_digest=True)
    return client.stub.Info(request, timeout=60, wait_for_ready=True).tables[0].digest


def torn_files(directory: Path, kind: str) -> list[str]:
    """Complete-named checkpoint files that do not read back whole."""
    torn = []
    for _, path in generic.checkpoints(directory, kind):
        try:
            generic.read_checkpoint(path, kind)
        except CorruptCheckpoint as err:
            torn.append(str(err))
    return torn


def tmp_left(directory: Path) -> bool:
    return any(p.name.endswith(".tmp") for p in directory.iterdir())


class Results:
    def __init__(self):
        self.outcomes: dict[str, Counter] = {}
        self.failures: list[dict] = []
        self.mid_write: Counter = Counter()
        self.by_point: dict[str, list[tuple[int, str]]] = {}  # (crash point, outcome)

    def record(self, part: str, outcome: str, **detail) -> None:
        self.outcomes.setdefault(part, Counter())[outcome] += 1
        if detail.get("kill_at"):
            self.by_point.setdefault(part, []).append((detail["kill_at"], outcome))
        if outcome not in ("previous", "new"):
            self.failures.append({"part": part, "outcome": outcome, **detail})
            log(f"FAILED {part}: {outcome} {detail}")


# --- replay ------------------------------------------------------------------------------------


class ReplayChain:
    """Replay processes one after another on one checkpoint directory."""

    def __init__(self, workdir: Path, capacity: int, obs_dim: int, results: Results, part: str):
        self.workdir, self.results, self.part, self.obs_dim = workdir, results, part, obs_dim
        self.ckpt = workdir / f"{part}-ckpt"
        self.flags = ["--checkpoint-dir", str(self.ckpt), "--checkpoint-interval", "0",
                      "--capacity", str(capacity), "--min-size-to-sample", "1"]  # fmt: skip
        self.candidates: dict[str, str] = {}  # outcome -> table digest
        self.inserted = 0
        self.kill_at = 0  # the crash point of the process that checkpointed last
        self.crashes = True  # False: files are damaged on purpose, not torn by a crash

    def start(self, kill_at: int = 0, batch: int = 50) -> tuple[Service, ReplayClient]:
        """A process restored from the directory, checked against the candidates, then
        given an insert and a sample and `batch` more items: the state it will checkpoint."""
        crashed = tmp_left(self.ckpt) if self.ckpt.exists() else False
        torn = torn_files(self.ckpt, "replay") if self.ckpt.exists() and self.crashes else []
        service = Service(self.workdir, "replay", self.flags, kill_at)
        client = ReplayClient(service.address, timeout=60, retry_seconds=30)
        restored = digest(client)
        if self.candidates:
            outcome = next((k for k, d in self.candidates.items() if d == restored), "a mix")
            if torn:
                outcome = "torn file"
            info = client.info()
            self.results.record(
                self.part, outcome, kill_at=self.kill_at, torn=torn,
                restored=[info.size, info.inserts, info.samples], expected=self.counts,
                files=sorted(p.name for p in self.ckpt.iterdir()),
            )  # fmt: skip
            self.results.mid_write[self.part] += crashed
        for start in range(self.inserted, self.inserted + batch, 5000):
            rows = min(5000, self.inserted + batch - start)
            client.insert(transitions(rows, start, self.obs_dim))
        if batch:
            client.sample(8)
        self.inserted += batch
        self.kill_at = kill_at
        self.candidates = {"previous": restored, "new": digest(client)}
        info = client.info()
        self.counts = [info.size, info.inserts, info.samples]
        return service, client


def replay_points(workdir: Path, rounds: int, results: Results) -> dict:
    chain = ReplayChain(workdir, 10_000, 4, results, "replay-points")
    service, client = chain.start(batch=500)
    client.checkpoint()  # the first complete checkpoint
    points, trials = [], 0
    for _ in range(rounds):
        n = 1
        while True:
            client.close()
            service.kill()
            service, client = chain.start(kill_at=n)
            trials += 1
            try:  # no retry: the call fails when the process is killed
                client.stub.Checkpoint(replay_pb2.CheckpointRequest(), timeout=60)
                survived = True
            except Exception:  # noqa: BLE001 - killed mid-call: UNAVAILABLE or a reset stream
                survived = False
                service.process.wait(30)
            if survived:
                # Past the last crash point: the process returned from the write.
                points.append(n - 1)
                break
            n += 1
    client.close()
    service.kill()
    chain.start(batch=0)[0].kill()  # checks the last trial
    return {"crash_points_per_write": points, "trials": trials}


def replay_random(workdir: Path, trials: int, items: int, results: Results, rng) -> dict:
    chain = ReplayChain(workdir, items * 2, 64, results, "replay-random")
    service, client = chain.start(batch=items)
    started = time.perf_counter()
    client.checkpoint()
    duration = time.perf_counter() - started
    log(f"replay-random: a checkpoint of {items} items took {duration:.3f} s")
    for trial in range(trials):
        client.close()
        service.kill()
        service, client = chain.start(batch=items // 10)
        call = client.stub.Checkpoint.future(replay_pb2.CheckpointRequest(), timeout=60)
        time.sleep(rng.uniform(0, 1.5 * duration))
        service.kill()
        call.cancel()
        if trial % 20 == 19:
            log(f"replay-random: {trial + 1} trials, {dict(results.outcomes[chain.part])}")
    client.close()
    service.kill()
    chain.start(batch=0)[0].kill()  # checks the last trial
    return {"checkpoint_seconds": round(duration, 3), "trials": trials}


# --- learner -----------------------------------------------------------------------------------


class LearnerChain:
    def __init__(self, workdir: Path, replay: str, results: Results, part: str):
        self.workdir, self.results, self.part = workdir, results, part
        self.ckpt = workdir / f"{part}-ckpt"
        self.flags = ["--replay", replay, "--checkpoint-dir", str(self.ckpt),
                      "--checkpoint-interval", "0", "--batch-size", "32"]  # fmt: skip
        self.candidates: dict[str, tuple[int, dict]] = {}
        self.step = 0

    def verify(self) -> str:
        crashed = tmp_left(self.ckpt)
        torn = torn_files(self.ckpt, "learner")
        # At (or past) max_updates from the start: it serves what it resumed, never trains.
        flags = [*self.flags, "--max-updates", str(max(self.step, 1))]
        service = Service(self.workdir, "learner", flags)
        with LearnerClient(service.address, timeout=30) as client:
            params = client.get_parameters()
        service.kill()
        outcome = "a mix"
        for name, (step, arrays) in self.candidates.items():
            same = arrays.keys() == params.arrays.keys() and all(
                np.array_equal(arrays[k], params.arrays[k]) for k in arrays
            )
            if params.update_step == step and same:
                outcome = name
        if torn:
            outcome = "torn file"
        self.results.record(self.part, outcome, step=params.update_step, torn=torn)
        self.results.mid_write[self.part] += crashed
        self.step = params.update_step
        self.candidates = {"previous": (params.update_step, params.arrays)}
        return outcome

    def crash(self, kill_at: int = 0, kill_after: float | None = None) -> tuple[bool, float]:
        """Trains 20 updates, then SIGTERM (a final checkpoint); returns (survived, seconds
        from SIGTERM to exit)."""
        target = self.step + LEARNER_UPDATES
        flags = [*self.flags, "--max-updates", str(target)]
        service = Service(self.workdir, "learner", flags, kill_at)
        with LearnerClient(service.address, timeout=30) as client:
            deadline = time.monotonic() + 120
            while (params := client.get_parameters()).update_step < target:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"learner did not reach update {target}")
                time.sleep(0.05)
        self.candidates["new"] = (params.update_step, params.arrays)
        started = time.perf_counter()
        service.process.send_signal(signal.SIGTERM)
        if kill_after is not None:
            time.sleep(kill_after)
            service.kill()
        code = service.process.wait(60)
        return code == 0, time.perf_counter() - started


def filled_replay(workdir: Path) -> Service:
    replay = Service(workdir, "replay", ["--min-size-to-sample", "100"])
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(2000, 4)).astype(np.float32)
    with ReplayClient(replay.address) as client:
        client.insert({"obs": obs, "action": rng.integers(2, size=2000),
                       "reward": np.ones(2000, np.float32),
                       "discount": np.full(2000, 0.99**3, np.float32),
                       "next_obs": obs + 0.1})  # fmt: skip
    return replay


def rename_point(directory: Path, kind: str) -> int:
    """The crash point just before the rename of the next write into `directory`, if it
    holds the same arrays as the newest checkpoint there: leftovers deleted, the create,
    the file's pieces (prefix, header, digest, each array and each non-empty gap), the
    fsync and the close come first."""
    _, newest = generic.checkpoints(directory, kind)[-1]
    data = newest.read_bytes()
    header = json.loads(data[16 : 16 + int.from_bytes(data[8:16], "little")])
    pieces, end = 3, 0
    for desc in header["arrays"].values():
        pieces += 1 + (desc["offset"] > end)
        end = desc["offset"] + desc["nbytes"]
    leftovers = sum(p.name.startswith(f".{kind}-") for p in directory.iterdir())
    return leftovers + 1 + pieces + 3


def learner_points(
    workdir: Path, replay: str, stride: int, results: Results, around_rename: bool = False
) -> dict:
    """Every `stride`th crash point until a write survives; or (around_rename) the points
    just before and just after the rename, whose outcomes must be previous and new."""
    chain = LearnerChain(workdir, replay, results, "learner-points")
    chain.crash()  # the first complete checkpoint
    chain.verify()
    if around_rename:
        tried = []
        for after, expected in ((0, "previous"), (1, "new")):
            # Counted anew: a crash mid-write leaves a temp file the next write deletes first.
            tried.append(rename_point(chain.ckpt, "learner") + after)
            chain.crash(kill_at=tried[-1])
            outcome = chain.verify()
            if outcome != expected:
                results.record(chain.part, f"{outcome} where {expected} was due", kill_at=tried[-1])
        return {"crash_points_tried": tried, "trials": 2}
    n, trials = 1, 0
    while True:
        survived, _ = chain.crash(kill_at=n)
        chain.verify()
        trials += 1
        if survived:
            break
        n += stride
    return {"crash_points_tried": n, "stride": stride, "trials": trials}


def learner_random(workdir: Path, replay: str, trials: int, results: Results, rng) -> dict:
    chain = LearnerChain(workdir, replay, results, "learner-random")
    _, stop_seconds = chain.crash()
    chain.verify()
    for _ in range(trials):
        chain.crash(kill_after=rng.uniform(0, 1.5 * stop_seconds))
        chain.verify()
    return {"sigterm_to_exit_seconds": round(stop_seconds, 3), "trials": trials}


# --- damaged files -----------------------------------------------------------------------------


def damage(workdir: Path, trials: int, server_every: int, results: Results, rng) -> dict:
    """The newest checkpoint cut at a random byte or with a random bit flipped."""
    chain = ReplayChain(workdir, 10_000, 4, results, "damage")
    service, client = chain.start(batch=3000)
    client.checkpoint()
    older = digest(client)
    client.insert(transitions(3000, 3000))
    client.checkpoint()
    client.close()
    service.kill()
    (_, older_path), (_, newest) = replay_checkpoint.checkpoints(chain.ckpt)
    chain.part = "damage-restart"  # what the restarted processes restore
    chain.crashes = False
    intact = newest.read_bytes()
    hows = Counter()
    for trial in range(trials):
        data = bytearray(intact)
        if trial % 2:
            position = rng.randrange(len(data))
            data[position] ^= 1 << rng.randrange(8)
            how = "flip"
        else:
            position = rng.randrange(len(data))
            del data[position:]
            how = "cut"
        hows[how] += 1
        newest.write_bytes(bytes(data))
        try:
            replay_checkpoint.read_checkpoint(newest)
            outcome = "accepted"
        except CorruptCheckpoint as err:
            outcome = "previous" if str(newest) in str(err) else "refused without the file"
        if outcome == "previous":
            path, _ = replay_checkpoint.load_newest(chain.ckpt)
            outcome = "previous" if path == older_path else "not the previous"
        if outcome == "previous" and server_every and trial % server_every == 0:
            chain.candidates = {"previous": older}
            service, client = chain.start(batch=0)
            client.close()
            service.kill()
            hows["through a server"] += 1
        results.record("damage", outcome, how=how, position=position, size=len(intact))
    newest.write_bytes(intact)
    return {"file_bytes": len(intact), "trials": dict(hows)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parts = ["replay-points", "replay-random", "learner-points", "learner-random", "damage"]
    parser.add_argument("--parts", nargs="+", choices=parts, default=parts)
    parser.add_argument("--rounds", type=int, default=2, help="replay-points sweeps")
    parser.add_argument("--random-trials", type=int, default=100)
    parser.add_argument("--random-items", type=int, default=30_000)
    parser.add_argument("--learner-stride", type=int, default=3)
    parser.add_argument("--learner-random-trials", type=int, default=20)
    parser.add_argument("--damage-trials", type=int, default=200)
    parser.add_argument("--server-every", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    logging.getLogger("apexrl").setLevel(logging.ERROR)  # each refused file is a trial here
    results = Results()
    report: dict = {"settings": vars(args)}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="checkpoint-crash-") as tmp:
        workdir = Path(tmp)
        if "replay-points" in args.parts:
            report["replay-points"] = replay_points(workdir, args.rounds, results)
        if "replay-random" in args.parts:
            report["replay-random"] = replay_random(
                workdir, args.random_trials, args.random_items, results, rng
            )
        if {"learner-points", "learner-random"} & set(args.parts):
            replay = filled_replay(workdir)
            try:
                if "learner-points" in args.parts:
                    report["learner-points"] = learner_points(
                        workdir, replay.address, args.learner_stride, results
                    )
                if "learner-random" in args.parts:
                    report["learner-random"] = learner_random(
                        workdir, replay.address, args.learner_random_trials, results, rng
                    )
            finally:
                replay.kill()
        if "damage" in args.parts:
            report["damage"] = damage(workdir, args.damage_trials, args.server_every, results, rng)
    report["outcomes"] = {part: dict(c) for part, c in results.outcomes.items()}
    report["landed_mid_write"] = dict(results.mid_write)
    report["trials"] = sum(sum(c.values()) for c in results.outcomes.values())
    report["failures"] = results.failures
    report["seconds"] = round(time.monotonic() - started, 1)
    print(json.dumps(report))
    return 1 if results.failures else 0


if __name__ == "__main__":
    threading.excepthook = lambda a: log(f"thread {a.thread.name}: {a.exc_value!r}")
    sys.exit(main())
