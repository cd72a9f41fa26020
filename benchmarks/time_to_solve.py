"""Time to solve CartPole-v1: apexrl local mode against Stable-Baselines3 DQN, same protocol.

    .venv/bin/python benchmarks/time_to_solve.py --seeds 5        # both, one JSON line each + summary
    .venv/bin/python benchmarks/time_to_solve.py --only apexrl

Protocol for both: wall seconds and env steps from launch until the mean return of 10 greedy
evaluation episodes first reaches the env's threshold (475). Time spent evaluating is excluded
for SB3 (training pauses while it evaluates after each training round); apexrl evaluates in
its own process concurrently, so its figure *includes* what the evaluator costs the other
processes on the shared cores (conservative). SB3 uses the rl-baselines3-zoo CartPole-v1
hyperparameters (hyperparams/dqn.yml). Prints figures, never pass/fail.
"""

import argparse
import csv
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ENV, THRESHOLD, EVAL_EPISODES = "CartPole-v1", 475.0, 10

# rl-baselines3-zoo, hyperparams/dqn.yml, CartPole-v1.
ZOO = dict(learning_rate=2.3e-3, batch_size=64, buffer_size=100_000, learning_starts=1000, gamma=0.99,
           target_update_interval=10, train_freq=256, gradient_steps=128, exploration_fraction=0.16,
           exploration_final_eps=0.04, policy_kwargs=dict(net_arch=[256, 256]))  # fmt: skip
ZOO_TIMESTEPS = 50_000


def run_apexrl(seed: int, budget: float, workdir: Path) -> dict:
    run_dir = workdir / f"apexrl-{seed}"
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "apexrl.cli", "local", "--run-dir", str(run_dir), "--seed", str(seed),
         "--max-seconds", str(budget)],
        capture_output=True, text=True, timeout=budget + 300,
    )  # fmt: skip
    wall = time.monotonic() - started
    last = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else result.stderr[-500:]
    match = re.match(r"solved in ([\d.]+) s \(([\d,]+) env steps\)", last)
    with open(run_dir / "metrics.csv") as fh:
        rows = list(csv.DictReader(fh))
    seconds = float(rows[-1]["seconds"]) if rows else 0.0
    return {
        "system": "apexrl", "seed": seed, "solved": bool(match),
        "seconds": float(match.group(1)) if match else None,
        "env_steps": int(match.group(2).replace(",", "")) if match else None,
        "process_wall_seconds": round(wall, 1),
        "env_steps_per_s": round(float(rows[-1]["env_steps"]) / seconds, 1) if seconds else 0.0,
        "updates_per_s": round(float(rows[-1]["updates"]) / seconds, 1) if seconds else 0.0,
        "last_line": last,
    }  # fmt: skip


def greedy_mean(model, seed: int) -> float:
    import gymnasium as gym

    envs = gym.vector.SyncVectorEnv([lambda: gym.make(ENV) for _ in range(EVAL_EPISODES)])
    obs, _ = envs.reset(seed=seed)
    returns, running = np.zeros(EVAL_EPISODES), np.ones(EVAL_EPISODES, bool)
    while running.any():
        actions, _ = model.predict(obs, deterministic=True)
        obs, rewards, terminated, truncated, _ = envs.step(actions)
        returns += rewards * running
        running &= ~(terminated | truncated)
    envs.close()
    return float(returns.mean())


def run_sb3(seed: int, budget: float, max_steps: int) -> dict:
    import torch
    from stable_baselines3 import DQN
    from stable_baselines3.common.callbacks import BaseCallback

    torch.set_num_threads(2)  # SB3 is one process: let it use both cores
    launched = time.monotonic()

    class EvalAfterTraining(BaseCallback):
        """Evaluates after each training round (the policy changes only then), off the clock."""

        def __init__(self):
            super().__init__()
            self.eval_seconds, self.solved_at, self.evals = 0.0, None, 0

        def _on_rollout_end(self) -> None:
            if self.num_timesteps <= ZOO["learning_starts"]:
                return
            started = time.monotonic()
            mean = greedy_mean(self.model, seed=10_000 + self.evals)
            self.evals += 1
            self.eval_seconds += time.monotonic() - started
            if mean >= THRESHOLD and self.solved_at is None:
                self.solved_at = (
                    time.monotonic() - launched - self.eval_seconds,
                    self.num_timesteps,
                )

        def _on_step(self) -> bool:
            clock = time.monotonic() - launched - self.eval_seconds
            return self.solved_at is None and clock < budget

    callback = EvalAfterTraining()
    model = DQN("MlpPolicy", ENV, seed=seed, verbose=0, **ZOO)
    model.learn(total_timesteps=max_steps, callback=callback)
    solved = callback.solved_at is not None
    return {
        "system": "sb3-dqn-zoo", "seed": seed, "solved": solved,
        "seconds": round(callback.solved_at[0], 1) if solved else None,
        "env_steps": callback.solved_at[1] if solved else None,
        "eval_seconds_excluded": round(callback.eval_seconds, 1), "evaluations": callback.evals,
    }  # fmt: skip


def summarize(runs: list[dict]) -> dict:
    solved = [r for r in runs if r["solved"]]
    seconds = [r["seconds"] for r in solved]
    return {
        "seeds": len(runs), "solved": len(solved),
        "median_seconds": statistics.median(seconds) if len(solved) == len(runs) else None,
        "worst_seconds": max(seconds) if len(solved) == len(runs) else None,
        "median_env_steps": statistics.median(r["env_steps"] for r in solved) if solved else None,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument(
        "--budget", type=float, default=300.0, help="seconds per run before 'not solved'"
    )
    parser.add_argument(
        "--sb3-max-steps",
        type=int,
        default=4 * ZOO_TIMESTEPS,
        help="SB3 env step budget (zoo trains 50,000; extra lets late solvers count)",
    )
    parser.add_argument("--only", choices=["apexrl", "sb3"])
    args = parser.parse_args()
    results: dict[str, list[dict]] = {"apexrl": [], "sb3": []}
    with tempfile.TemporaryDirectory(prefix="apexrl-tts-") as tmp:
        for seed in range(1, args.seeds + 1):
            if args.only in (None, "apexrl"):
                results["apexrl"].append(run_apexrl(seed, args.budget, Path(tmp)))
                print(json.dumps(results["apexrl"][-1]), flush=True)
            if args.only in (None, "sb3"):
                results["sb3"].append(run_sb3(seed, args.budget, args.sb3_max_steps))
                print(json.dumps(results["sb3"][-1]), flush=True)
    summary = {name: summarize(runs) for name, runs in results.items() if runs}
    if "apexrl" in summary and "sb3" in summary and summary["sb3"]["median_seconds"]:
        ours, peer = summary["apexrl"]["median_seconds"], summary["sb3"]["median_seconds"]
        summary["apexrl_over_sb3_median"] = round(ours / peer, 3) if ours else None
    summary["targets"] = "apexrl median <= 20 s, solved on every seed, <= 0.5 x SB3 median"
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
