"""Atari figures: compressed replay memory, replay and learner-input rates, learner updates.

    .venv/bin/python benchmarks/atari.py                      # figures (~3 minutes)
    .venv/bin/python benchmarks/atari.py --learn-minutes 60   # also a Pong learning curve

Everything goes through what the services run: frames the actor code plays (make_vector_env,
NStepAdder, reward clipping, `pack`: one zstd frame per transition holding obs and next_obs),
a real `apexrl replay` process, the shipping ReplayClient at the services' batch sizes (insert
64, sample 512 on the learner's SampleStream path), and the learner's own decode and update
(Learner.to_device, Learner._update).

1. Bytes per stored transition: the replay process's resident memory (VmRSS) grown from an
   empty table to `capacity` (>= 200,000) transitions, per transition: frames, keys,
   priorities, small columns, sum tree, Python objects and allocator overhead, all of it.
   The table's own accounting (Info.stored_bytes) is printed beside it. Pong and MsPacman,
   random play (the games' frames; a trained agent's differ a little).
2. Insert and sample together: `writers` processes insert compressed Pong transitions (64 per
   call) while one process samples batches of 512 through sample_stream, for `seconds`,
   rate limiter off. Ape-X's rates: 12.5K inserts/s with 19 batches/s of 512.
3. Learner input: batches of 512 sampled and decoded (Learner.to_device without the SGD step).
4. Learner updates/s on this CPU: Nature CNN, batch 512 (and 32, local mode's CPU setting),
   in float32 and with precision bfloat16 (autocast; Atari's default `auto` on this CPU),
   one torch thread, medians of 3 timings.
5. Checkpoint stall: a replay holding `stall_items` (1M) compressed Pong transitions; one
   thread samples 512 at a time, another inserts 64 at a time, for `seconds` without and then
   with a Checkpoint call: the slowest call of each kind, both ways.

6. The emulator, sim only: Pong frames per CPU-second (and per wall second) of random play,
   `sim_envs` envs, one thread: EnvPool alone (its own stack of 4, the protocol's settings),
   EnvPool through make_vector_env (envpool_atari: FireToStart, stack, SAME_STEP) and the
   gymnasium path (ale-py under gymnasium's wrappers in a SyncVectorEnv).
7. The actor: `apexrl local --env ALE/Pong-v5 --actors 1` with each `--atari-backend`; once the
   actor steps, over `actor_seconds`: its frames (4 x its apexrl_actor_env_steps counter) per
   CPU-second of the actor process (utime + stime of all its threads, /proc), and per second.

8. Where a dqn actor's CPU goes, per env step (4 frames), on one torch thread: the emulator
   (EnvPool through make_vector_env), acting (policy.step on the batch of `actor_envs` uint8
   observations), initial priorities (policy.priorities, batches of 64) and packing (zstd,
   64 at a time), from Pong frames.

    .venv/bin/python benchmarks/atari.py --backends-only     # 6 to 8 only (~5 minutes)

The last line is one JSON object (keys named in issue 12's "Figures").
"""

import argparse
import json
import math
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from replay_load import proc_stats  # benchmarks/, on sys.path as the script's folder

from apexrl.algorithms.envs import FRAME_SKIP  # also atari_impala's, through this module

RAW_PAIR_BYTES = 2 * 4 * 84 * 84


def played_transitions(game: str, count: int, seed: int = 0) -> list[dict]:
    """Insert batches of 64 packed transitions, played by random actors as the actor does."""
    from apexrl import algorithms
    from apexrl.algorithms.adders.nstep import NStepAdder
    from apexrl.algorithms.columns import pack
    from apexrl.algorithms.envs import final_observations, make_vector_env
    from apexrl.config import AgentConfig

    columns = algorithms.transition_columns(AgentConfig(env=game))
    envs, obs = make_vector_env(game, 8, seed)
    adder = NStepAdder(8, 3, 0.99)
    pending, batches, made = [], [], 0
    while made < count:
        actions = envs.action_space.sample()
        next_obs, rewards, terminated, truncated, infos = envs.step(actions)
        out = adder.record(
            obs, actions, np.clip(rewards, -1, 1), terminated, truncated,
            final_observations(next_obs, infos),
        )  # fmt: skip
        obs = next_obs
        if out is not None:
            pending.append(out)
            if sum(len(p["action"]) for p in pending) >= 64:
                batch = {k: np.concatenate([p[k] for p in pending])[:64] for k in pending[0]}
                batches.append(pack(batch, columns))
                made += 64
                pending = []
    envs.close()
    return batches


def signature(game: str) -> str:
    from apexrl import algorithms
    from apexrl.config import AgentConfig

    return ",".join(c.spec() for c in algorithms.transition_columns(AgentConfig(env=game)))


def start_replay(
    game: str, capacity: int, folder: Path, *flags: str
) -> tuple[subprocess.Popen, str]:
    ready = folder / f"ready-{time.monotonic_ns()}.json"
    command = [sys.executable, "-m", "apexrl.cli", "replay", "--host", "127.0.0.1", "--port", "0",
               "--metrics-port", "0", "--ready-file", str(ready), "--capacity", str(capacity),
               "--signature", signature(game), "--min-size-to-sample", "1000",
               "--log-level", "WARNING", *flags]  # fmt: skip
    process = subprocess.Popen(command)
    while not ready.exists():
        if process.poll() is not None:
            raise RuntimeError("replay did not start")
        time.sleep(0.05)
    return process, f"127.0.0.1:{json.loads(ready.read_text())['port']}"


def rss(pid: int) -> int:
    return proc_stats(pid)["rss"]


def bytes_per_transition(game: str, capacity: int, folder: Path) -> dict:
    from apexrl.replay.client import ReplayClient

    batches = played_transitions(game, 12_800)
    sizes = np.concatenate([b["observations"].sizes for b in batches])
    process, address = start_replay(game, capacity, folder)
    try:
        with ReplayClient(address) as client:
            client.info()
            before = rss(process.pid)
            inserted = 0
            while inserted < capacity:
                client.insert(batches[(inserted // 64) % len(batches)])
                inserted += 64
            info = client.info()
            after = rss(process.pid)
    finally:
        process.terminate()
        process.wait(30)
    return {
        "game": game,
        "capacity": capacity,
        # + 8: the keys array (8 B a slot) is written whole when the table is made, so it is in
        # the baseline; every other page is touched as items arrive.
        "rss_bytes_per_transition": round((after - before) / info.size + 8, 1),
        "table_bytes_per_transition": round(info.stored_bytes / info.size, 1),
        "frame_bytes_mean": round(float(sizes.mean()), 1),
        "compression_ratio": round(RAW_PAIR_BYTES / float(sizes.mean()), 1),
    }


def _writer(address, batches, start, stop, counts, index) -> None:
    from apexrl.replay.client import ReplayClient

    with ReplayClient(address, retry_seconds=0) as client:
        start.wait()
        i = 0
        while not stop.is_set():
            client.insert(batches[i % len(batches)])
            i += 1
            counts[index] = i * 64


def _sampler(address, start, stop, counts, index, decode: bool) -> None:
    from apexrl.replay.client import ReplayClient

    learner = _decoder() if decode else None
    with ReplayClient(address, retry_seconds=0) as client:
        start.wait()
        for n, batch in enumerate(client.sample_stream(512), 1):
            if learner is not None:
                learner.to_device(batch)
            counts[index] = n
            if stop.is_set():
                break


def _decoder(precision: str = "float32"):
    """A CPU learner for Pong: its to_device is the input pipeline's decode (no SGD step)."""
    import prometheus_client

    from apexrl import algorithms
    from apexrl.common.parameters import ParameterStore
    from apexrl.config import LearnerConfig
    from apexrl.learner.metrics import LearnerMetrics
    from apexrl.learner.training import Learner

    config = LearnerConfig(env="ALE/Pong-v5", device="cpu", batch_size=512, precision=precision)
    builder = algorithms.make(config)
    # The algorithm's figures as gauges, as the learner's server registers them.
    metrics = LearnerMetrics(
        prometheus_client.CollectorRegistry(), builder.metrics.figures, builder.metrics.loss_help
    )
    return Learner(config, builder, metrics, ParameterStore())


def rates(batches: list[dict], writers: int, seconds: float, folder: Path, decode: bool) -> dict:
    """Writers and one sampler (decoding like the learner when `decode`) at once."""
    from apexrl.replay.client import ReplayClient

    process, address = start_replay("ALE/Pong-v5", 200_000, folder)
    ctx = mp.get_context("spawn")
    start, stop = ctx.Event(), ctx.Event()
    counts = ctx.Array("q", writers + 1)
    try:
        with ReplayClient(address) as client:  # sampling can start at once
            for batch in batches[:32]:
                client.insert(batch)
        procs = [ctx.Process(target=_writer, args=(address, batches, start, stop, counts, i))
                 for i in range(writers)]  # fmt: skip
        procs.append(
            ctx.Process(target=_sampler, args=(address, start, stop, counts, writers, decode))
        )
        for p in procs:
            p.start()
        time.sleep(3 if not decode else 8)  # spawn + imports (torch for the decoder)
        start.set()
        begin = list(counts)
        t0 = time.perf_counter()
        time.sleep(seconds)
        end, elapsed = list(counts), time.perf_counter() - t0
        stop.set()
        for p in procs:
            p.join(60)
    finally:
        process.terminate()
        process.wait(30)
    inserted = sum(end[:writers]) - sum(begin[:writers])
    sampled = end[writers] - begin[writers]
    return {
        "writers": writers,
        "insert_transitions_per_s": round(inserted / elapsed),
        "sample_batches_per_s": round(sampled / elapsed, 1),
        "sample_transitions_per_s": round(512 * sampled / elapsed),
    }


def _timed_calls(client_factory, call, stop, out: list) -> None:
    with client_factory() as client:
        while not stop.is_set():
            started = time.perf_counter()
            call(client)
            out.append((started, time.perf_counter() - started))


def checkpoint_stall(items: int, seconds: float, folder: Path, batches: list[dict]) -> dict:
    """Slowest sample and insert calls without and during a checkpoint of `items` items."""
    import threading

    from apexrl.replay.client import ReplayClient

    process, address = start_replay("ALE/Pong-v5", items, folder, "--checkpoint-dir", str(folder / "ckpt"), "--checkpoint-interval", "0")  # fmt: skip
    try:
        with ReplayClient(address) as client:
            for i in range(items // 64):
                client.insert(batches[i % len(batches)])
            figures = {"items": client.info().size}

            def client_factory():
                return ReplayClient(address)

            for phase in ("without", "with"):
                stop, samples, inserts = threading.Event(), [], []
                threads = [
                    threading.Thread(target=_timed_calls, args=(client_factory, lambda c: c.sample(512), stop, samples)),
                    threading.Thread(target=_timed_calls, args=(client_factory, lambda c, b=batches[0]: c.insert(b), stop, inserts)),
                ]  # fmt: skip
                for t in threads:
                    t.start()
                time.sleep(seconds / 2)
                if phase == "with":
                    started = time.perf_counter()
                    response = client.checkpoint()
                    figures["checkpoint_seconds"] = round(time.perf_counter() - started, 2)
                    figures["checkpoint_bytes"] = response.size_bytes
                time.sleep(seconds / 2)
                stop.set()
                for t in threads:
                    t.join(60)
                figures[f"max_sample_ms_{phase}"] = round(1e3 * max(d for _, d in samples), 1)
                figures[f"max_insert_ms_{phase}"] = round(1e3 * max(d for _, d in inserts), 1)
                figures[f"calls_{phase}"] = len(samples) + len(inserts)
    finally:
        process.terminate()
        process.wait(60)
    figures["max_extra_wait_ms"] = max(
        figures["max_sample_ms_with"] - figures["max_sample_ms_without"],
        figures["max_insert_ms_with"] - figures["max_insert_ms_without"],
    )
    return figures


def learner_updates_per_s(batch_size: int, updates: int, precision: str) -> float:
    import queue

    import torch

    learner = _decoder(precision)
    learner.config.batch_size = batch_size
    n = batch_size
    columns = {
        "obs": torch.randint(0, 255, (n, 4, 84, 84), dtype=torch.uint8),
        "next_obs": torch.randint(0, 255, (n, 4, 84, 84), dtype=torch.uint8),
        "action": torch.randint(0, 6, (n,)),
        "reward": torch.zeros(n),
        "discount": torch.full((n,), 0.97),
    }
    weights, keys, sink = torch.ones(n), np.arange(n), queue.Queue()
    rates = []
    for _ in range(3):  # the median of 3 timings, each after a warm-up update
        learner._update(columns, weights, keys, sink)
        started = time.perf_counter()
        for _ in range(updates):
            learner._update(columns, weights, keys, sink)
        rates.append(updates / (time.perf_counter() - started))
    return round(statistics.median(rates), 2)


def run_local_pong(
    seconds: float, run_dir: Path, *flags: str, seed: int = 1, env: str = "ALE/Pong-v5"
) -> list[dict]:
    """`apexrl local` on an Atari game (a target it cannot reach: it runs its whole budget); its
    metrics.csv rows."""
    import csv

    command = [sys.executable, "-m", "apexrl.cli", "local", "--env", env,
               "--target-return", "100000", "--max-seconds", str(seconds), "--seed", str(seed),
               "--run-dir", str(run_dir), *flags]  # fmt: skip
    subprocess.run(command, check=False)
    with open(run_dir / "metrics.csv") as fh:
        return list(csv.DictReader(fh))


def learn(
    minutes: float,
    folder: Path,
    seed: int,
    algorithm: str = "dqn",
    env: str = "ALE/Pong-v5",
    config: str = "",
) -> dict:
    """apexrl local on a game for a wall budget (settings from a TOML file over the presets when
    `config` names one): its metrics.csv is the learning curve."""
    run_dir = folder / f"{algorithm}-{env.split('/')[-1]}-seed{seed}"
    flags = ["--algorithm", algorithm, *(["--config", config] if config else [])]
    rows = run_local_pong(minutes * 60, run_dir, *flags, seed=seed, env=env)
    evaluated = [r for r in rows if r["eval_mean_return"] not in ("", "nan")]
    best = [float(r["eval_best_mean_return"]) for r in evaluated
            if r["eval_best_mean_return"] not in ("", "nan")]  # fmt: skip
    curve = [(float(r["seconds"]), float(r["env_steps"]) * FRAME_SKIP,
              float(r["eval_mean_return"])) for r in evaluated]  # fmt: skip
    return {
        "run_dir": str(run_dir),
        "curve_seconds_frames_score": curve[:: max(1, len(curve) // 30)],
        "best_score": max((c[2] for c in curve), default=math.nan),
        # the evaluator's best model: a new best's score over all of its episodes (2 + 4 here)
        "best_model_score": max(best, default=math.nan),
        "env_frames": float(rows[-1]["env_steps"]) * FRAME_SKIP if rows else 0,
        "updates": float(rows[-1]["updates"]) if rows else 0,
    }


def scores(curve: dict, env: str) -> dict:
    """The learning run's headline figures, named after its game (ALE/Breakout-v5: breakout)."""
    game = env.split("/")[-1].split("-")[0].lower()
    return {
        f"atari_{game}_best_greedy_score": curve["best_score"],
        f"atari_{game}_best_model_score": curve["best_model_score"],
    }


def sim_frames(backend: str, num_envs: int, steps: int) -> dict:
    """Pong frames per CPU-second and per second of random play on one thread (section 6)."""
    from apexrl.algorithms.envs import EnvOptions, make_vector_env

    if backend == "envpool alone":
        import envpool

        envs = envpool.make("Pong-v5", env_type="gymnasium", num_envs=num_envs, num_threads=1,
                            seed=0, repeat_action_probability=0.25, use_fire_reset=False)  # fmt: skip
        envs.reset()
    else:
        envs, _ = make_vector_env("ALE/Pong-v5", num_envs, 0, EnvOptions(atari_backend=backend))
    rng = np.random.default_rng(0)
    actions = rng.integers(0, 6, (steps, num_envs))
    cpu, wall = time.process_time(), time.perf_counter()
    for a in actions:
        envs.step(a)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    envs.close()
    frames = FRAME_SKIP * num_envs * steps
    return {
        "backend": backend,
        "num_envs": num_envs,
        "frames_per_cpu_s": round(frames / cpu),
        "frames_per_s": round(frames / wall),
    }


def process_of(ready_file: Path, timeout: float = 180) -> int:
    """The pid of the process started with --ready-file `ready_file` (local mode's child)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:  # ended meanwhile
                continue
            if str(ready_file).encode() in args:
                return int(pid)
        time.sleep(0.2)
    raise RuntimeError(f"no process with --ready-file {ready_file}")


def actor_frames(backend: str, seconds: float, folder: Path, num_envs: int) -> dict:
    """Section 7: one actor of `apexrl local` on Pong, frames per CPU-second of its process."""
    from scale_services import cpu_seconds, scrape  # benchmarks/, as proc_stats

    run_dir = folder / f"actor-{backend}-{time.monotonic_ns()}"
    settings = folder / f"actor-{num_envs}.toml"
    settings.write_text(f"[actor]\nnum_envs = {num_envs}\n")
    command = [sys.executable, "-m", "apexrl.cli", "local", "--env", "ALE/Pong-v5", "--actors", "1",
               "--atari-backend", backend, "--target-return", "100000", "--max-seconds", "900",
               "--seed", "1", "--run-dir", str(run_dir), "--config", str(settings)]  # fmt: skip
    local = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    try:
        ready = run_dir / "ready" / "actor-0.json"
        pid = process_of(ready)
        while not ready.exists():
            time.sleep(0.2)
        port = json.loads(ready.read_text())["metrics_port"]
        steps = "apexrl_actor_env_steps_total"
        while scrape(port).get(steps, 0) == 0:  # the first parameters, then the first step
            time.sleep(0.5)
        time.sleep(10)  # warm up: the first pulls, the first inserts
        before = (scrape(port)[steps], cpu_seconds(pid), time.perf_counter())
        time.sleep(seconds)
        after = (scrape(port)[steps], cpu_seconds(pid), time.perf_counter())
        log = (run_dir / "logs" / "actor-0.log").read_text()
    finally:
        local.terminate()
        local.wait(120)
    frames = FRAME_SKIP * (after[0] - before[0])
    return {
        "backend": backend,
        "num_envs": num_envs,
        "frames_per_actor_cpu_s": round(frames / (after[1] - before[1])),
        "frames_per_s": round(frames / (after[2] - before[2])),
        "actor_cpu_s_per_s": round((after[1] - before[1]) / (after[2] - before[2]), 2),
        "envpool_fallback_logged": "not EnvPool" in log,
    }


def actor_costs(num_envs: int) -> dict:
    """Section 8: CPU milliseconds per env step of each part of a dqn actor's step."""
    import torch

    from apexrl import algorithms
    from apexrl.algorithms.columns import pack
    from apexrl.algorithms.envs import EnvOptions, make_vector_env
    from apexrl.config import ActorConfig

    torch.set_num_threads(1)
    config = ActorConfig(env="ALE/Pong-v5", algorithm="dqn")
    policy, rng = algorithms.make(config).policy(), np.random.default_rng(0)
    envs, obs = make_vector_env("ALE/Pong-v5", num_envs, 0, EnvOptions(atari_backend="envpool"))
    frames = [obs]
    while len(frames) * num_envs < 64 + 3 * num_envs:
        frames.append(envs.step(rng.integers(0, 6, num_envs))[0])
    seen = np.concatenate(frames)
    batch = {"obs": seen[:64], "next_obs": seen[3 * num_envs :][:64],
             "action": rng.integers(0, 6, 64), "reward": np.zeros(64, np.float32),
             "discount": np.full(64, 0.97, np.float32)}  # fmt: skip
    columns = algorithms.transition_columns(config)

    def ms_per_env_step(call, items: int, repeats: int) -> float:
        call()
        started = time.process_time()
        for _ in range(repeats):
            call()
        return round(1e3 * (time.process_time() - started) / repeats / items, 3)

    costs = {
        "emulator": ms_per_env_step(lambda: envs.step(rng.integers(0, 6, num_envs)), num_envs, 200),
        "acting": ms_per_env_step(lambda: policy.step(obs, 0.1, rng), num_envs, 50),
        "priorities": ms_per_env_step(lambda: policy.priorities(batch), 64, 10),
        "packing": ms_per_env_step(lambda: pack(batch, columns), 64, 10),
    }  # fmt: skip
    envs.close()
    return {"num_envs": num_envs, "cpu_ms_per_env_step": costs}


def backends(args, folder: Path) -> dict:
    """Sections 6 and 7, with the load average beside each."""
    sims = []
    for backend in ("envpool alone", "envpool", "gymnasium"):
        sims.append(sim_frames(backend, args.sim_envs, 4000 // args.sim_envs * 4) | load())
        print(json.dumps({"sim_only": sims[-1]}), flush=True)
    costs = actor_costs(args.actor_envs) | load()
    print(json.dumps({"actor_costs": costs}), flush=True)
    actors = {}
    for backend in ("envpool", "gymnasium"):
        actors[backend] = actor_frames(backend, args.actor_seconds, folder, args.actor_envs)
        print(json.dumps({"actor": actors[backend] | load()}), flush=True)
    alone = sims[0]["frames_per_cpu_s"]
    return {
        "atari_envpool_sim_frames_per_core_s": alone,
        "atari_gymnasium_sim_frames_per_core_s": sims[2]["frames_per_cpu_s"],
        "atari_actor_frames_per_core_s_envpool": actors["envpool"]["frames_per_actor_cpu_s"],
        "atari_actor_frames_per_core_s_gymnasium": actors["gymnasium"]["frames_per_actor_cpu_s"],
        "atari_actor_share_of_envpool_sim": round(
            actors["envpool"]["frames_per_actor_cpu_s"] / alone, 3
        ),
    }


def load() -> dict:
    return {"load_average_1m": round(os.getloadavg()[0], 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--capacity", type=int, default=200_000)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--writers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1, help="rate runs (median reported)")
    parser.add_argument("--stall-items", type=int, default=1_000_000)
    parser.add_argument("--learn-minutes", type=float, default=0.0)
    parser.add_argument("--learn-only", action="store_true", help="only the learning curve")
    parser.add_argument("--seed", type=int, default=1, help="the learning run's seed")
    parser.add_argument("--algorithm", default="dqn", help="the learning run's algorithm")
    parser.add_argument("--env", default="ALE/Pong-v5", help="the learning run's game")
    parser.add_argument("--config", default="", help="the learning run's TOML settings file")
    parser.add_argument("--backends-only", action="store_true", help="only sections 6 and 7")
    parser.add_argument("--sim-envs", type=int, default=4, help="envs of the sim-only timings")
    parser.add_argument("--actor-envs", type=int, default=4, help="the actor's num_envs")
    parser.add_argument("--actor-seconds", type=float, default=60.0)
    args = parser.parse_args()
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    folder = Path(tempfile.mkdtemp(prefix="apexrl-atari-"))
    figures: dict = {}
    if args.backends_only:
        print(json.dumps(backends(args, folder)), flush=True)
        return
    if args.learn_only:
        curve = learn(args.learn_minutes, folder, args.seed, args.algorithm, args.env, args.config)
        print(json.dumps({"learning": curve}), flush=True)
        print(json.dumps(scores(curve, args.env)), flush=True)
        return
    memory = [
        bytes_per_transition(g, args.capacity, folder) for g in ("ALE/Pong-v5", "ALE/MsPacman-v5")
    ]
    for m in memory:
        print(json.dumps(m), flush=True)
    batches = played_transitions("ALE/Pong-v5", 12_800, seed=1)
    runs = [
        rates(batches, args.writers, args.seconds, folder, decode=False)
        for _ in range(args.repeats)
    ]
    for r in runs:
        print(json.dumps({"insert_and_sample": r}), flush=True)
    inputs = [rates(batches, 1, args.seconds, folder, decode=True) for _ in range(args.repeats)]
    for r in inputs:
        print(json.dumps({"learner_input_with_one_writer": r}), flush=True)
    updates = {
        f"{precision}_{b}": learner_updates_per_s(b, 3 if b > 64 else 20, precision)
        for b in (512, 32)
        for precision in ("float32", "bfloat16")
    }
    print(json.dumps({"learner_updates_per_s_cpu": updates}), flush=True)
    stall = checkpoint_stall(args.stall_items, args.seconds, folder, batches)
    print(json.dumps({"checkpoint_stall": stall}), flush=True)
    figures = {
        "atari_replay_bytes_per_transition": memory[0]["rss_bytes_per_transition"],
        "atari_replay_bytes_per_transition_mspacman": memory[1]["rss_bytes_per_transition"],
        "atari_compression_ratio": memory[0]["compression_ratio"],
        "atari_insert_transitions_per_s": statistics.median(r["insert_transitions_per_s"] for r in runs),
        "atari_sample_transitions_per_s": statistics.median(r["sample_transitions_per_s"] for r in runs),
        "atari_sample_batches_per_s": statistics.median(r["sample_batches_per_s"] for r in runs),
        "atari_learner_input_batches_per_s": statistics.median(r["sample_batches_per_s"] for r in inputs),
        "atari_learner_updates_per_s": updates["float32_512"],
        "atari_learner_updates_per_s_batch_32": updates["float32_32"],
        "atari_learner_updates_per_s_bfloat16": updates["bfloat16_512"],
        "atari_learner_updates_per_s_bfloat16_batch_32": updates["bfloat16_32"],
        "atari_checkpoint_max_extra_wait_ms": stall["max_extra_wait_ms"],
    }  # fmt: skip
    figures |= backends(args, folder)
    if args.learn_minutes:
        curve = learn(args.learn_minutes, folder, args.seed, args.algorithm, args.env, args.config)
        print(json.dumps({"learning": curve}), flush=True)
        figures |= scores(curve, args.env)
    print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
