"""`apexrl local` end to end: it learns CartPole, writes its run folder, leaves nothing behind."""

import csv
import re
import signal
import subprocess
import sys
import time
import tomllib

import numpy as np
import psutil
import pytest

from apexrl.common import checkpoint
from tests.conftest import metric, read_ready_file, wait_for
from tests.e2e.test_video import decoded, render_size
from tests.unit.test_tensorboard import read_scalars

pytestmark = pytest.mark.slow

TARGET = 475.0  # CartPole-v1's threshold
# benchmarks/time_to_solve.py on 2026-12-01, beside a CI run: CartPole 5/5 seeds solved in
# 11.7-57.0 s (median 17.9 s); Pendulum with dpg in 32.5 s. The budget is about twice the
# slowest: room for a busier machine, not 20x what the benchmark shows.
BUDGET = 120
FRESH_EPISODES = 100
PENDULUM_TARGET = -200.0  # local mode's default for Pendulum-v1 (gymnasium gives it none)


def leftover_processes(marker: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any(marker in part for part in proc.info["cmdline"] or []):
                found.append(proc)
        except psutil.Error:
            pass
    return found


def play_unseen(run_dir) -> tuple[str, float]:
    """`apexrl eval` on the run's best model, FRESH_EPISODES episodes on seeds from 1,000,000
    (which no evaluation used): (its first line, naming the version, and the mean return)."""
    played = subprocess.run(
        [sys.executable, "-m", "apexrl.cli", "eval", "--checkpoint", str(run_dir / "checkpoints"),
         "--episodes", str(FRESH_EPISODES)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert played.returncode == 0, played.stderr
    mean = re.search(rf"^mean (-?[\d.]+), .* over {FRESH_EPISODES} episodes$", played.stdout, re.M)
    assert mean, played.stdout
    print(played.stdout.splitlines()[0], "->", mean.group(0))
    return played.stdout.splitlines()[0], float(mean.group(1))


def test_local_mode_solves_cartpole_and_the_saved_model_solves_on_fresh_seeds(tmp_path):
    """With --video-every (a K so large that only the first new best is recorded) and
    --tensorboard: one video, event files that hold metrics.csv's values."""
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "apexrl.cli", "local", "--run-dir", str(run_dir),
         "--max-seconds", str(BUDGET), "--seed", "1", "--video-every", "1000",
         "--tensorboard", str(tmp_path / "tb")],
        capture_output=True, text=True, timeout=BUDGET + 300,
    )  # fmt: skip
    last_line = result.stdout.strip().splitlines()[-1]
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    solved = re.fullmatch(r"solved in [\d.]+ s \([\d,]+ env steps\) by version (\d+) \(mean return"
                          r" [\d.]+\); best model: version (\d+) .*", last_line)  # fmt: skip
    assert solved, last_line
    solver, version = int(solved.group(1)), int(solved.group(2))
    for name in ("config.toml", "metrics.csv", "learning_curve.png"):
        assert (run_dir / name).stat().st_size > 0
    assert list((run_dir / "checkpoints").glob("learner-*.ckpt"))
    assert not leftover_processes(str(run_dir))
    for name in ("replay", "learner", "actor-0", "actor-1", "evaluator"):
        assert "stopped" in (run_dir / "logs" / f"{name}.log").read_text(), name

    # What stopped the run: the best model's score (60 episodes, two rounds) reached the target.
    with open(run_dir / "metrics.csv") as fh:
        rows = list(csv.DictReader(fh))
    last_row = rows[-1]
    assert_tensorboard_holds(read_scalars(tmp_path / "tb" / "run"), rows)
    (video,) = (run_dir / "videos").iterdir()  # the first new best model's
    assert video.name.startswith("CartPole-v1-version-")
    episode_return = float(re.search(r"-return-(.*)\.mp4$", video.name)[1])
    assert decoded(video) == (render_size("CartPole-v1"), episode_return + 1)
    assert float(last_row["eval_best_mean_return"]) >= TARGET, last_row
    assert int(float(last_row["eval_best_version"])) == solver
    # The final line then names the best model kept when every service had stopped: the
    # solving version, or one that beat its score while the evaluator was stopping.
    _, meta, _ = checkpoint.load_newest(run_dir / "checkpoints", "best")
    assert meta["version"] == version >= solver
    assert meta["mean_return"] >= float(last_row["eval_best_mean_return"]) >= TARGET
    assert meta["protocol"]["episodes"] == 60 and len(meta["returns"]) == 60

    # The saved model solves on episodes the evaluator never played (seeds from 1,000,000).
    header, mean = play_unseen(run_dir)
    assert f", version {version} (update " in header, header
    assert mean >= 0.95 * TARGET


def assert_tensorboard_holds(scalars: dict, rows: list[dict]) -> None:
    """Every metrics.csv column is a scalar at step env_steps with the row's value (as the
    float32 an event holds), rows without a value (NaN) left out."""
    assert set(scalars) == set(rows[0])
    for column, events in scalars.items():
        expected = [
            (int(float(row["env_steps"])), float(np.float32(row[column])))
            for row in rows
            if not np.isnan(float(row[column]))
        ]
        assert events == expected, column


def test_local_mode_solves_pendulum_with_dpg(tmp_path):
    """One setting switches the stack to Ape-X DPG; its best model holds on fresh seeds."""
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "apexrl.cli", "local", "--algorithm", "dpg", "--env", "Pendulum-v1",
         "--run-dir", str(run_dir), "--max-seconds", str(BUDGET), "--seed", "1"],
        capture_output=True, text=True, timeout=BUDGET + 300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1].startswith("solved in "), result.stdout[-2000:]
    _, meta, _ = checkpoint.load_newest(run_dir / "checkpoints", "best")
    assert meta["mean_return"] >= PENDULUM_TARGET and meta["protocol"]["episodes"] == 60
    assert tomllib.loads((run_dir / "config.toml").read_text())["algorithm"] == "dpg"
    _, mean = play_unseen(run_dir)
    # Pendulum's returns spread wide (a hard start costs ~-350 where an easy one is ~0; a random
    # policy scores ~-1,200): on unseen seeds the best model stays within 25% of the target
    # (measured: -143.3 over its 60 evaluation episodes, -159.3 over 100 fresh ones).
    assert mean >= 1.25 * PENDULUM_TARGET


@pytest.mark.parametrize("algorithm", ["ppo", "impala"])
def test_local_mode_solves_cartpole_on_policy(tmp_path, algorithm):
    """One setting switches the stack to on-policy learning from a queue of unrolls (the
    table local mode configured is one); the best model holds on fresh seeds. That each unroll
    is sampled exactly once is checked on the queue's books in test_prompt_stops.py."""
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "apexrl.cli", "local", "--algorithm", algorithm,
         "--run-dir", str(run_dir), "--max-seconds", str(BUDGET), "--seed", "1"],
        capture_output=True, text=True, timeout=BUDGET + 300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1].startswith("solved in "), result.stdout[-2000:]
    (table,) = tomllib.loads((run_dir / "config.toml").read_text())["replay"]["tables"]
    assert (table["sampler"], table["max_times_sampled"]) == ("fifo", 1)
    _, mean = play_unseen(run_dir)
    assert mean >= 0.95 * TARGET


def test_local_mode_stops_every_child_on_sigint(tmp_path):
    """With 2 replay shards: both serve (each holds transitions), and both stop."""
    run_dir = tmp_path / "run"
    local = subprocess.Popen(
        [sys.executable, "-m", "apexrl.cli", "local", "--run-dir", str(run_dir), "--target-return", "1e9",
         "--replay-shards", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        csv = run_dir / "metrics.csv"
        wait_for(
            lambda: csv.exists() and len(csv.read_text().splitlines()) > 2, 120, "progress rows"
        )
        # local + 6 services; the evaluator starts once the learner serves (its imports would
        # compete with the learner's on a small machine). psutil's start times rest on the
        # boot time in whole seconds: 1 s of slack, still short of the learner's imports.
        wait_for(lambda: len(leftover_processes(str(run_dir))) >= 7, 60, "every service")
        (evaluator,) = [p for p in leftover_processes(str(run_dir)) if "evaluator" in p.cmdline()]
        learner_ready = (run_dir / "ready" / "learner.json").stat().st_mtime
        assert evaluator.create_time() > learner_ready - 1.0
        # The actors and the evaluator of an MLP policy act in numpy: torch's library is not
        # even mapped into them; the learner's holds it.
        services = leftover_processes(str(run_dir))
        torch_in = {role: [any("libtorch" in m.path for m in p.memory_maps()) for p in services
                           if role in p.cmdline()] for role in ("actor", "evaluator", "learner")}  # fmt: skip
        assert torch_in == {"actor": [False, False], "evaluator": [False], "learner": [True]}
        for shard in (0, 1):  # each shard's own ready file gives its metrics port
            ready = read_ready_file(run_dir / "ready" / f"replay-{shard}.json")
            wait_for(lambda p=ready["metrics_port"]: metric(p, "apexrl_replay_size") > 0, 60,
                     f"transitions in shard {shard}")  # fmt: skip
            assert metric(ready["metrics_port"], "apexrl_replay_shard") == shard
        local.send_signal(signal.SIGINT)
        output, _ = local.communicate(timeout=120)
    finally:
        if local.poll() is None:
            local.kill()
    assert local.returncode == 130
    assert output.strip().splitlines()[-1] == "not solved: interrupted"
    deadline = time.monotonic() + 10
    while leftover_processes(str(run_dir)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not leftover_processes(str(run_dir))
