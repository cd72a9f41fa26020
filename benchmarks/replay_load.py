"""Replay load test: many writers, samplers and a priority updater against one replay process.

    .venv/bin/python benchmarks/replay_load.py                   # 60 s (what the slow test runs)
    .venv/bin/python benchmarks/replay_load.py --seconds 3600    # soak, on demand (not in CI)
    .venv/bin/python benchmarks/replay_load.py --seconds 10 --json

One `apexrl replay` process (`python -m apexrl.cli replay`, port 0, ready file) on 127.0.0.1,
and worker processes (multiprocessing "spawn", all started before the parent opens any gRPC
channel), each with its own apexrl.replay.client.ReplayClient (retry_seconds=0, so an
UNAVAILABLE is an error here, not a silent retry):

- writers: ReplayClient.insert of CartPole-shaped batches (obs f32[4], action i64, reward f32,
  discount f32, next_obs f32[4]) with random priorities, back to back. Each row carries its id,
  worker << 32 | seq (seq counts the writer's rows from 0), in its int64 action column, and
  every other column is a fixed function of that id (`transitions`);
- samplers: ReplayClient.sample(sample_batch, beta), back to back;
- updaters: sample(update_batch) keys, then update_priorities on the keys sampled `update_lag`
  calls earlier (a learner's prefetch lag) with random priorities. Keys evicted meanwhile come
  back as `stale`: expected, counted, never an error.

Every sampled row is checked (`check_rows`, outside the timed call): its id names a writer,
its seq is below the rows that writer had sent before the sample returned (each writer
publishes that count in shared memory before its insert), and its other columns equal the
function of its id. A row that no writer inserted (lost, mixed with another row, corrupted,
invented) counts as a mismatch.

Every worker times each call (the whole client call: request building, the RPC, decoding) into
a fixed log-spaced histogram (2% buckets, 10 us to 120 s: bounded memory however long the run)
and counts failures by gRPC status code (or exception type). All workers start together
(a barrier) and stop at the deadline (an Event), finishing their call in flight.

The parent polls the replay process every second: VmRSS and Threads from /proc/PID/status,
open fds from /proc/PID/fd, and the table's size and counters from Info. The table's capacity
is small enough that it fills early; "at capacity" is the window from the first poll with
size == capacity to the deadline: its RSS should be flat (pages of the preallocated columns
are all touched by then, and FIFO eviction overwrites them). Threads (by name) and fds are
compared to the first poll after a warm-up, at the last poll under load. One pool may grow
under load: gRPC's EventEngine pool ("event_engine" threads) starts a thread whenever all of
its threads are busy (at most one per second, with no upper bound: a CPU-starved machine
looks like that), and ends a thread beyond its reserve (clamp(cores, 4, 16)) once it has
found no work for 20 s (work_stealing_thread_pool.cc). While any client is connected its
pings and calls keep waking pool threads, so the pool need not shrink. So after the load,
once every client has closed its channel (workers exited, the parent's own closed), the
parent polls /proc (at most settle_timeout) until the replay is back to the threads, by
name, and the fds it had before its first client: the pool back to its reserve, every
connection closed. A leaked thread, whatever its name, or a leaked fd never goes away.
At the end the replay gets SIGTERM and must exit 0.

The rate limiter is set explicitly so it never throttles: samples_per_insert 0 (no
sample/insert ratio) and min_size_to_sample 1000 (only the first samples wait, a fraction of
a second). The script exits 1 on any failed call or a replay that does not exit 0 on
SIGTERM or any sampled row no writer inserted; tests/integration/test_load.py asserts the
memory, thread and fd bounds as well.
"""

import argparse
import itertools
import json
import math
import multiprocessing as mp
import os
import queue
import sys
import tempfile
import threading
import time
from collections import deque
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path

import grpc
import numpy as np
from replay_throughput import log, server_process, stop_process

from apexrl.replay.client import ReplayClient

RPCS = ("Insert", "Sample", "UpdatePriorities")
ROW_COUNTS = ("checked", "mismatches", "unknown_writer", "unsent", "wrong_columns")
MIB = 1 << 20

# Latency histogram: bucket i holds [LO * STEP^i, LO * STEP^(i+1)); below LO counts in bucket
# 0, above the top in the last one (exact max is kept separately).
LATENCY_LO, LATENCY_STEP, LATENCY_HI = 1e-5, 1.02, 120.0
LATENCY_BUCKETS = math.ceil(math.log(LATENCY_HI / LATENCY_LO) / math.log(LATENCY_STEP))
_LOG_STEP = math.log(LATENCY_STEP)


@dataclass(frozen=True)
class Settings:
    seconds: float = 60.0
    writers: int = 16
    samplers: int = 2
    updaters: int = 1
    capacity: int = 50_000  # full within ~2-10 s on 2 shared cores (5-30k inserts/s)
    insert_batch: int = 64  # an actor's default insert_batch
    sample_batch: int = 256  # a learner's default batch_size
    update_batch: int = 256
    update_lag: int = 4  # updater: priorities go to the keys sampled this many calls before
    beta: float = 0.4
    min_size_to_sample: int = 1000
    samples_per_insert: float = 0.0  # 0: the ratio is off, the limiter never holds inserts
    error_buffer: float = 0.0
    call_timeout: float = 30.0  # deadline of every call
    poll_interval: float = 1.0
    # After the load, with no client left, how long the replay may take to come back to its
    # threads and fds before the first client (gRPC ends an extra pool thread after 20 s
    # without work, polling every 3 s at most; see settle).
    settle_timeout: float = 90.0
    warmup: float = -1.0  # seconds before the thread/fd baseline; < 0: min(10, seconds / 4)
    seed: int = 1

    @property
    def warmup_seconds(self) -> float:
        return self.warmup if self.warmup >= 0 else min(10.0, self.seconds / 4)


# --- rows: a writer's id in each, the rest a function of it ------------------------------

COLUMNS = ("obs", "action", "reward", "discount", "next_obs")
_OBS_SHIFTS = np.array([0, 16, 32, 48], np.uint64)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64: uint64 -> well-spread uint64 (wrapping arithmetic, vectorized)."""
    x = x + 0x9E3779B97F4A7C15
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB
    return x ^ (x >> 31)


def row_ids(worker: int, first_seq: int, n: int) -> np.ndarray:
    """Ids of a writer's rows first_seq .. first_seq + n - 1: worker << 32 | seq (int64)."""
    return (worker << 32) | np.arange(first_seq, first_seq + n, dtype=np.int64)


def transitions(ids: np.ndarray) -> dict[str, np.ndarray]:
    """CartPole-shaped rows, each a fixed function of its id, which the action column carries
    (same dtype and size as a real action). Every float is a multiple of 2^-13 or 2^-6 in a
    small range, exact in float32, so a row read back compares bit for bit."""
    h = _mix(ids.astype(np.uint64))
    g = _mix(h)
    obs = ((h[:, None] >> _OBS_SHIFTS) & 0xFFFF).astype(np.float32) / 8192 - 4
    return {
        "obs": obs,
        "action": ids,
        "reward": (g & 0xFF).astype(np.float32) / 64 - 2,
        "discount": np.where((g >> 8) & 1, 0.99, 0.0).astype(np.float32),
        "next_obs": obs + np.float32(0.01),
    }


def check_rows(columns: dict[str, np.ndarray], sent: np.ndarray) -> dict[str, int]:
    """Counts sampled rows that no writer inserted. `sent[w]`: rows writer w had sent, read
    after the sample returned. A row mismatches when its id names no writer ("unknown_writer"),
    a seq that writer had not sent ("unsent"), or its other columns differ from what the id
    gives ("wrong_columns"); "mismatches" counts rows with any of these."""
    ids = np.asarray(columns.get("action", np.zeros(0, np.int64)))
    n = len(ids)
    counts = {"checked": n, "mismatches": 0, "unknown_writer": 0, "unsent": 0, "wrong_columns": 0}
    if n == 0:
        return counts
    if sorted(columns) != sorted(COLUMNS) or ids.dtype != np.int64:
        return counts | {"mismatches": n, "wrong_columns": n}
    worker, seq = ids >> 32, ids & 0xFFFFFFFF
    known = (worker >= 0) & (worker < len(sent))
    unsent = known & (seq >= sent[np.where(known, worker, 0)])
    expected = transitions(ids)
    wrong = np.zeros(n, bool)
    for name in COLUMNS:
        got = np.asarray(columns[name])
        if got.shape != expected[name].shape or got.dtype != expected[name].dtype:
            wrong[:] = True
            break
        wrong |= (got != expected[name]).reshape(n, -1).any(axis=1)
    return counts | {
        "mismatches": int((~known | unsent | wrong).sum()),
        "unknown_writer": int((~known).sum()),
        "unsent": int(unsent.sum()),
        "wrong_columns": int(wrong.sum()),
    }


# --- workers: each in its own spawned process ---------------------------------------------


class Recorder:
    """Per-RPC call counts, items, latency histogram, max and sum, errors by code."""

    def __init__(self) -> None:
        self.stats = {
            rpc: {
                "calls": 0,
                "items": 0,
                "errors": {},
                "hist": np.zeros(LATENCY_BUCKETS, np.int64),
                "max_s": 0.0,
                "sum_s": 0.0,
            }
            for rpc in RPCS
        }
        self.messages: list[str] = []  # the first few error messages
        self.stale = 0
        self.updated = 0
        self.rows = dict.fromkeys(ROW_COUNTS, 0)

    def check(self, batch, sent) -> None:
        """Checks a sampled batch's rows against what the writers had sent (see check_rows)."""
        if batch is None:
            return
        counts = check_rows(batch.columns, np.frombuffer(sent, np.int64).copy())
        for key, n in counts.items():
            self.rows[key] += n
        if counts["mismatches"] and len(self.messages) < 5:
            self.messages.append(f"Sample: rows no writer inserted: {counts}")

    def call(self, rpc: str, items: int, fn, *args, **kwargs):
        """Runs fn(*args, **kwargs) timed; returns its result, or None after counting its failure."""
        started = time.perf_counter()
        try:
            result = fn(*args, **kwargs)
        except Exception as err:
            code = err.code().name if isinstance(err, grpc.RpcError) else type(err).__name__
            errors = self.stats[rpc]["errors"]
            errors[code] = errors.get(code, 0) + 1
            if len(self.messages) < 5:
                details = err.details() if isinstance(err, grpc.RpcError) else str(err)
                self.messages.append(f"{rpc} {code}: {details}")
            return None
        elapsed = time.perf_counter() - started
        s = self.stats[rpc]
        s["calls"] += 1
        s["items"] += items
        s["sum_s"] += elapsed
        s["max_s"] = max(s["max_s"], elapsed)
        i = int(math.log(elapsed / LATENCY_LO) / _LOG_STEP) if elapsed > LATENCY_LO else 0
        s["hist"][min(i, LATENCY_BUCKETS - 1)] += 1
        return result


def _work(role, index, client: ReplayClient, settings: Settings, stop, sent, rec: Recorder):
    """One worker's loop. Writer `index` owns sent[index]; samplers only read `sent`."""
    rng = np.random.default_rng([settings.seed, index])
    if role == "writer":
        b = settings.insert_batch
        for seq in itertools.count(0, b):
            if stop.is_set():
                return
            columns = transitions(row_ids(index, seq, b))
            priorities = rng.uniform(0.1, 2.0, b).astype(np.float32)
            # Published before the call: once the rows can be sampled, samplers know them.
            sent[index] = seq + b
            rec.call("Insert", b, client.insert, columns, priorities)
    elif role == "sampler":
        while not stop.is_set():
            b = settings.sample_batch
            rec.check(rec.call("Sample", b, client.sample, b, beta=settings.beta), sent)
    else:  # updater
        n, pending = settings.update_batch, deque()
        while not stop.is_set():
            batch = rec.call("Sample", n, client.sample, n, beta=settings.beta)
            rec.check(batch, sent)
            if batch is not None:
                pending.append(batch.keys)
            if len(pending) <= settings.update_lag:
                continue
            keys, priorities = pending.popleft(), rng.uniform(0.1, 2.0, n).astype(np.float32)
            response = rec.call("UpdatePriorities", n, client.update_priorities, keys, priorities)
            if response is not None:
                rec.updated += response.updated
                rec.stale += response.stale


def _worker(role, index, address, settings, barrier, stop, sent, results) -> None:
    rec, failure = Recorder(), None
    try:
        with ReplayClient(address, timeout=settings.call_timeout, retry_seconds=0) as client:
            grpc.channel_ready_future(client.channel).result(timeout=120)
            barrier.wait(timeout=300)
            _work(role, index, client, settings, stop, sent, rec)
    except BaseException as err:  # reported to the parent, which fails the run
        failure = f"{role} {index}: {err!r}"
        barrier.abort()
    finally:
        results.put(
            {
                "role": role,
                "stats": rec.stats,
                "messages": rec.messages,
                "stale": rec.stale,
                "updated": rec.updated,
                "rows": rec.rows,
                "failure": failure,
            }
        )


# --- the parent: replay process, polling, report ------------------------------------------


def proc_stats(pid: int) -> dict[str, int]:
    """Resident memory (bytes), threads and open fds of a process, from /proc."""
    fields = {}
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "Threads"):
                fields[key] = int(value.split()[0])
    return {
        "rss": fields["VmRSS"] * 1024,
        "threads": fields["Threads"],
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
        "thread_names": thread_names(pid),
    }


def thread_names(pid: int) -> dict[str, int]:
    """Threads by name (/proc/PID/task/*/comm): python, grpc's event_engine pool, ..."""
    names: dict[str, int] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as fh:
                name = fh.read().strip()
        except FileNotFoundError:  # the thread ended meanwhile
            continue
        names[name] = names.get(name, 0) + 1
    return dict(sorted(names.items()))


def settle(pid: int, idle: dict, timeout: float, every: float) -> dict:
    """With no client left: polls until the replay has no more threads, name by name, and
    no more fds than `idle` (its figures before the first client), or until `timeout`.

    gRPC's EventEngine pool ("event_engine" threads) starts a thread when all of its
    threads are busy and ends one beyond its reserve after 20 s without work
    (kIdleThreadLimit in work_stealing_thread_pool.cc): demand, not a leak. Only with no
    connection left does no ping or call wake its threads, so only then must it shrink.
    A leaked thread (whatever its name) or fd never goes away.
    """
    started = time.monotonic()
    while True:
        stats = proc_stats(pid)
        waited = time.monotonic() - started
        names = stats["thread_names"]
        back = stats["fds"] <= idle["fds"] and all(
            n <= idle["thread_names"].get(name, 0) for name, n in names.items()
        )
        if back or waited >= timeout:
            return {
                "threads": stats["threads"],
                "thread_names": names,
                "fds": stats["fds"],
                "back_to_idle": back,
                "waited_s": round(waited, 1),
            }
        time.sleep(every)


def percentile(hist: np.ndarray, q: float) -> float:
    """The q-quantile (seconds) of a latency histogram: the geometric middle of its bucket."""
    total = int(hist.sum())
    if total == 0:
        return math.nan
    i = int(np.searchsorted(np.cumsum(hist), math.ceil(q * total)))
    return LATENCY_LO * LATENCY_STEP ** (i + 0.5)


def merge(outcomes: list[dict], seconds: float) -> dict[str, dict]:
    """Per-RPC figures over every worker."""
    rpcs = {}
    for rpc in RPCS:
        parts = [o["stats"][rpc] for o in outcomes]
        hist = sum((p["hist"] for p in parts), np.zeros(LATENCY_BUCKETS, np.int64))
        codes: dict[str, int] = {}
        for p in parts:
            for code, n in p["errors"].items():
                codes[code] = codes.get(code, 0) + n
        calls, items = sum(p["calls"] for p in parts), sum(p["items"] for p in parts)
        rpcs[rpc] = {
            "calls": calls,
            "errors": sum(codes.values()),
            "error_codes": codes,
            "p50_ms": round(percentile(hist, 0.50) * 1e3, 3),
            "p99_ms": round(percentile(hist, 0.99) * 1e3, 3),
            "max_ms": round(max(p["max_s"] for p in parts) * 1e3, 3),
            "mean_ms": round(sum(p["sum_s"] for p in parts) / max(calls, 1) * 1e3, 3),
            "calls_per_s": round(calls / seconds, 1),
            "items": items,
            "items_per_s": round(items / seconds, 1),
        }
    return rpcs


def min_calls_per_worker(outcomes: list[dict]) -> dict[str, int]:
    """The fewest successful calls any one worker made, by role (a starved worker shows)."""
    out: dict[str, int] = {}
    for o in outcomes:
        calls = sum(stat["calls"] for stat in o["stats"].values())
        out[o["role"]] = min(out.get(o["role"], calls), calls)
    return out


def counts_match(rpcs: dict[str, dict], info) -> bool:
    """Whether the server counted exactly the items the workers' successful calls carried
    (inserted, sampled, priorities updated or found stale): nothing lost, nothing doubled."""
    return (
        info.inserts == rpcs["Insert"]["items"]
        and info.samples == rpcs["Sample"]["items"]
        and info.priority_updates + info.stale_priority_updates == rpcs["UpdatePriorities"]["items"]
    )


def resources(polls: list[dict], capacity: int, warmup: float) -> dict:
    """Memory over the at-capacity window; threads and fds after warm-up vs the end."""
    full = [p for p in polls if p["size"] >= capacity]
    memory: dict = {"capacity_reached_s": full[0]["t"] if full else None}
    if len(full) >= 2:
        rss = np.array([p["rss"] for p in full], np.float64)
        t = np.array([p["t"] for p in full])
        memory |= {
            "window_s": round(t[-1] - t[0], 1),
            "window_polls": len(full),
            "rss_at_capacity_mib": round(rss[0] / MIB, 2),
            "rss_end_mib": round(rss[-1] / MIB, 2),
            "rss_growth_mib": round((rss[-1] - rss[0]) / MIB, 2),
            "rss_window_max_minus_min_mib": round((rss.max() - rss.min()) / MIB, 2),
            "rss_slope_mib_per_min": round(np.polyfit(t, rss / MIB, 1)[0] * 60, 3),
        }
    memory["rss_max_mib"] = round(max(p["rss"] for p in polls) / MIB, 2)
    warm = [p for p in polls if p["t"] >= warmup] or polls[-1:]
    out = {"memory": memory}
    for key in ("threads", "fds"):
        out[key] = {
            "first": polls[0][key],
            "after_warmup": warm[0][key],
            "end": polls[-1][key],
            "max": max(p[key] for p in polls),
            "max_after_warmup": max(p[key] for p in warm),
        }
    out["threads"] |= {
        "names_after_warmup": warm[0]["thread_names"],
        "names_max": {
            name: max(p["thread_names"].get(name, 0) for p in polls)
            for name in sorted({name for p in polls for name in p["thread_names"]})
        },
        "names_end": polls[-1]["thread_names"],
    }
    return out


def snapshot(pid: int, client: ReplayClient, t0: float) -> dict:
    """One poll: the replay's /proc figures, then its table's size and counters (Info)."""
    t, stats = time.monotonic() - t0, proc_stats(pid)
    info = client.info()
    return {"t": round(t, 2), **stats, "size": info.size, "inserts": info.inserts}


def poll(pid: int, client: ReplayClient, t0: float, deadline: float, every: float) -> list[dict]:
    """Snapshots at fixed ticks from t0 until the deadline, and one at the deadline (a tick
    missed while Info was slow is skipped, not bunched)."""
    polls, tick = [], t0
    while time.monotonic() < deadline:
        polls.append(snapshot(pid, client, t0))
        tick += every * max(1, math.ceil((time.monotonic() - tick) / every))
        time.sleep(max(0.0, min(tick, deadline) - time.monotonic()))
    polls.append(snapshot(pid, client, t0))
    return polls


def replay_command(s: Settings) -> list[str]:
    command = [sys.executable, "-m", "apexrl.cli", "replay", "--host", "127.0.0.1", "--port", "0"]
    command += ["--metrics-port", "0", "--capacity", str(s.capacity)]
    command += ["--min-size-to-sample", str(s.min_size_to_sample)]
    command += ["--samples-per-insert", str(s.samples_per_insert)]
    command += ["--error-buffer", str(s.error_buffer), "--seed", str(s.seed)]
    command += ["--grace-seconds", "5", "--log-level", "WARNING"]
    return command


def log_problems(text: str) -> list[str]:
    """Replay log lines that mean something went wrong (it logs at WARNING and above)."""
    words = ("ERROR", "CRITICAL", "Traceback", "Exception")
    return [line for line in text.splitlines() if any(w in line for w in words)][:20]


def run_load(seconds: float = 60.0, **overrides) -> dict:
    """Runs the load for `seconds` (Settings fields as keywords); returns the report."""
    s = Settings(seconds=seconds, **overrides)
    roles = ["writer"] * s.writers + ["sampler"] * s.samplers + ["updater"] * s.updaters
    ctx = mp.get_context("spawn")
    barrier, stop, results = ctx.Barrier(len(roles) + 1), ctx.Event(), ctx.Queue()
    # Rows each writer has sent: its own slot, written by it alone (no lock: an aligned
    # int64 store), read by the samplers after each sample.
    sent = ctx.RawArray("q", s.writers)
    with tempfile.TemporaryDirectory(prefix="replay-load-") as tmp, ExitStack() as stack:
        server = stack.enter_context(server_process("replay", replay_command(s), Path(tmp)))
        pid = server.process.pid
        procs = [
            ctx.Process(
                target=_worker,
                args=(role, i, server.address, s, barrier, stop, sent, results),
                name=f"load-{role}-{i}",
            )
            for i, role in enumerate(roles)
        ]
        stack.callback(_reap, procs)
        # Run first on the way out: workers leave their loops, or their wait at the barrier.
        stack.callback(barrier.abort)
        stack.callback(stop.set)
        idle = proc_stats(pid)  # before any client exists
        log(f"starting {len(procs)} worker processes against replay pid {pid}")
        for p in procs:
            p.start()
        # Only now does the parent open a channel of its own (workers are spawned, not forked,
        # but none of them inherits a channel either way).
        client = stack.enter_context(
            ReplayClient(server.address, timeout=s.call_timeout, retry_seconds=0)
        )
        # The parent's own connection is open before the first poll. Waiting for it, as the
        # workers do, rides out a starved machine (a handshake past gRPC's connect timeout).
        grpc.channel_ready_future(client.channel).result(timeout=120)
        client.info()
        try:
            barrier.wait(timeout=600)
        except threading.BrokenBarrierError:
            stop.set()
            raise RuntimeError(
                "workers failed to start: " + "; ".join(_failures(results, len(procs)))
            ) from None
        t0 = time.monotonic()
        log(f"load running for {s.seconds:g} s")
        polls = poll(pid, client, t0, t0 + s.seconds, s.poll_interval)
        stop.set()
        elapsed = time.monotonic() - t0
        outcomes = [results.get(timeout=s.call_timeout + 120) for _ in procs]
        stopped = time.monotonic() - t0
        usage = resources(polls, s.capacity, s.warmup_seconds)
        final = client.info()
        client.close()  # the last client: the workers' channels closed as they exited
        after_load = settle(pid, idle, s.settle_timeout, 1.0)
        alive = server.process.poll() is None
        exit_code = stop_process(server.process)
        replay_log = server.log_path.read_text()
    failures = [o["failure"] for o in outcomes if o["failure"]]
    rpcs = merge(outcomes, elapsed)
    rows = {key: sum(o["rows"][key] for o in outcomes) for key in ROW_COUNTS}
    report = {
        "settings": asdict(s) | {"warmup_seconds": s.warmup_seconds},
        "load_seconds": round(elapsed, 2),
        "workers_stopped_after_s": round(stopped, 2),
        "rpcs": rpcs,
        "errors": sum(r["errors"] for r in rpcs.values()),
        "error_messages": [m for o in outcomes for m in o["messages"]][:10],
        "worker_failures": failures,
        "stale_priority_updates": sum(o["stale"] for o in outcomes),
        "updated_priorities": sum(o["updated"] for o in outcomes),
        "min_calls_per_worker": min_calls_per_worker(outcomes),
        "rows_sent": sum(sent),
        "sampled_rows": rows,
        "server_counts_match": counts_match(rpcs, final),
        "server": {
            "size": final.size,
            "inserts": final.inserts,
            "samples": final.samples,
            "priority_updates": final.priority_updates,
            "stale_priority_updates": final.stale_priority_updates,
        },
        "idle": idle,
        **usage,
        "after_load": after_load,
        "replay_alive_at_end": alive,
        "replay_exit_code": exit_code,
        "replay_log_problems": log_problems(replay_log),
        "polls": polls,
    }
    return report


def _failures(results, n: int) -> list[str]:
    out = []
    for _ in range(n):
        try:
            outcome = results.get(timeout=30)
        except queue.Empty:
            break
        if outcome["failure"]:
            out.append(outcome["failure"])
    return out


def _reap(procs: list, timeout: float = 30.0) -> None:
    """Joins the workers within one shared `timeout`, then terminates the rest (a worker
    whose result nobody read stays blocked flushing it to the queue)."""
    deadline = time.monotonic() + timeout
    for p in procs:
        if p.pid is not None:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.pid is not None and p.is_alive():
            p.terminate()
            p.join()


def format_report(r: dict) -> str:
    s = r["settings"]
    lines = [
        f"replay load: {s['writers']} writers (insert {s['insert_batch']}), {s['samplers']}"
        f" samplers (sample {s['sample_batch']}, beta {s['beta']}), {s['updaters']} updater"
        f" ({s['update_batch']} keys, lag {s['update_lag']}) for {r['load_seconds']} s;"
        f" capacity {s['capacity']}, min_size_to_sample {s['min_size_to_sample']},"
        f" samples_per_insert {s['samples_per_insert']}, error_buffer {s['error_buffer']}",
        "",
        f"{'rpc':<17}{'calls':>9}{'errors':>8}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}"
        f"{'calls/s':>9}{'items/s':>11}",
    ]
    for name, x in r["rpcs"].items():
        lines.append(
            f"{name:<17}{x['calls']:>9}{x['errors']:>8}{x['p50_ms']:>9.2f}{x['p99_ms']:>9.2f}"
            f"{x['max_ms']:>9.1f}{x['calls_per_s']:>9.1f}{x['items_per_s']:>11.0f}"
            + (f"  {x['error_codes']}" if x["errors"] else "")
        )
    m, sv, rows = r["memory"], r["server"], r["sampled_rows"]
    lines += [
        "",
        f"fewest calls by one worker: {r['min_calls_per_worker']}",
        f"server: size {sv['size']}, inserts {sv['inserts']}, samples {sv['samples']},"
        f" priority updates {sv['priority_updates']} (+{sv['stale_priority_updates']} stale);"
        f" equal to the workers' counts: {r['server_counts_match']}",
        f"sampled rows checked: {rows['checked']} (every sampled row; {r['rows_sent']} rows"
        f" sent), not inserted by any writer: {rows['mismatches']} (unknown writer"
        f" {rows['unknown_writer']}, seq not yet sent {rows['unsent']}, wrong columns"
        f" {rows['wrong_columns']})",
        f"memory: idle RSS {r['idle']['rss'] / MIB:.1f} MiB, capacity reached at"
        f" {m['capacity_reached_s']} s",
    ]
    if "window_s" in m:
        lines.append(
            f"  at capacity ({m['window_s']} s, {m['window_polls']} polls): RSS"
            f" {m['rss_at_capacity_mib']} -> {m['rss_end_mib']} MiB"
            f" (growth {m['rss_growth_mib']:+} MiB, max-min {m['rss_window_max_minus_min_mib']}"
            f" MiB, slope {m['rss_slope_mib_per_min']:+} MiB/min); max {m['rss_max_mib']} MiB"
        )
    for key in ("threads", "fds"):
        x = r[key]
        lines.append(
            f"{key}: idle {r['idle'][key]}, first {x['first']}, after warm-up"
            f" ({r['settings']['warmup_seconds']:g} s) {x['after_warmup']}, end {x['end']},"
            f" max {x['max']}"
        )
    a, t = r["after_load"], r["threads"]
    lines += [
        f"threads by name: idle {r['idle']['thread_names']}, after warm-up"
        f" {t['names_after_warmup']}, max {t['names_max']}, end {t['names_end']}",
        f"after the load, no client left: threads {a['threads']} {a['thread_names']}, fds"
        f" {a['fds']}; back to idle: {a['back_to_idle']} (waited {a['waited_s']} s)",
    ]
    lines.append(
        f"replay: alive at end {r['replay_alive_at_end']}, exit code on SIGTERM"
        f" {r['replay_exit_code']}, log problems {len(r['replay_log_problems'])}"
    )
    for message in r["error_messages"] + r["worker_failures"] + r["replay_log_problems"]:
        lines.append(f"  ! {message}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = Settings()
    parser.add_argument("--seconds", type=float, default=defaults.seconds, help="load duration")
    for name in ("writers", "samplers", "updaters", "capacity", "insert_batch", "sample_batch"):
        parser.add_argument(
            "--" + name.replace("_", "-"), type=int, default=getattr(defaults, name)
        )
    parser.add_argument("--json", action="store_true", help="also print the report as JSON")
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    options = {k: v for k, v in vars(args).items() if k not in ("seconds", "json")}
    report = run_load(args.seconds, **options)
    print(format_report(report), flush=True)
    if args.json:
        print(json.dumps(report), flush=True)
    ok = report["errors"] == 0 and report["sampled_rows"]["mismatches"] == 0
    sys.exit(0 if ok and report["replay_exit_code"] == 0 else 1)


if __name__ == "__main__":
    main()
