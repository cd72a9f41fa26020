"""Time to solve CartPole-v1: apexrl local mode against Stable-Baselines3 DQN, same protocol.

    .venv/bin/python benchmarks/time_to_solve.py --seeds 5        # both, one JSON line each + summary
    .venv/bin/python benchmarks/time_to_solve.py --only apexrl

Protocol for both (apexrl's evaluator, reproduced for SB3): each new policy plays 10 greedy
episodes; one that beats the best score so far plays 50 more on fresh seeds and is scored by
the mean of all 60; it becomes the best model if that beats the best. Solved: the best model's
score reaches the env's threshold (475); the figure is wall seconds and env steps from launch
to then. Time spent evaluating is excluded for SB3 (training pauses while it evaluates after
each training round); apexrl evaluates in its own process concurrently, so its figure
*includes* what the evaluator costs the other processes on the shared cores (conservative).
Each run also reports when a single 10-episode evaluation first reached 475 (the old, looser
criterion), and plays its saved best model for 100 episodes on seeds no evaluation used
(from 1,000,000): "solved" should hold there too (>= 95% of 475 = 451). SB3 uses the
rl-baselines3-zoo CartPole-v1 hyperparameters (hyperparams/dqn.yml). Prints figures, never
pass/fail.
"""

import argparse
import copy
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

ENV, THRESHOLD, EVAL_EPISODES, CONFIRM_EPISODES = "CartPole-v1", 475.0, 10, 50
FRESH_EPISODES, FRESH_SEED = 100, 1_000_000  # the saved model, on seeds no evaluation used

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
    first_10 = next((r for r in rows if float(r["eval_mean_return"]) >= THRESHOLD), None)
    fresh = fresh_apexrl(run_dir / "checkpoints") if match else {}
    return {
        "system": "apexrl", "seed": seed, "solved": bool(match),
        "seconds": float(match.group(1)) if match else None,
        "env_steps": int(match.group(2).replace(",", "")) if match else None,
        "first_10_episode_475_seconds": float(first_10["seconds"]) if first_10 else None,
        **fresh,
        "process_wall_seconds": round(wall, 1),
        "env_steps_per_s": round(float(rows[-1]["env_steps"]) / seconds, 1) if seconds else 0.0,
        "updates_per_s": round(float(rows[-1]["updates"]) / seconds, 1) if seconds else 0.0,
        "last_line": last,
    }  # fmt: skip


def fresh_apexrl(checkpoints: Path) -> dict:
    """`apexrl eval` (the user's command) on the saved best model, 100 fresh episodes."""
    played = subprocess.run(
        [sys.executable, "-m", "apexrl.cli", "eval", "--checkpoint", str(checkpoints),
         "--episodes", str(FRESH_EPISODES), "--seed", str(FRESH_SEED)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    version = re.search(r", version (\d+) ", played.stdout)
    mean = re.search(r"^mean ([\d.]+), min ([\d.]+)", played.stdout, re.M)
    if played.returncode != 0 or not version or not mean:
        return {"fresh_error": (played.stdout + played.stderr)[-500:]}
    return {
        "best_version": int(version.group(1)),
        "fresh_100_mean": float(mean.group(1)),
        "fresh_100_min": float(mean.group(2)),
    }


def greedy_returns(model, episodes: int, seed: int) -> np.ndarray:
    """Returns of `episodes` greedy episodes, episode k on seed `seed + k` (as apexrl's)."""
    import gymnasium as gym

    envs = gym.vector.SyncVectorEnv([lambda: gym.make(ENV) for _ in range(episodes)])
    obs, _ = envs.reset(seed=seed)
    returns, running = np.zeros(episodes), np.ones(episodes, bool)
    while running.any():
        actions, _ = model.predict(obs, deterministic=True)
        obs, rewards, terminated, truncated, _ = envs.step(actions)
        returns += rewards * running
        running &= ~(terminated | truncated)
    envs.close()
    return returns


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
            self.first_10, self.best, self.best_state = None, -np.inf, None
            self.next_seed = seed  # apexrl's evaluator counts up from the run's seed too

        def play(self, episodes: int) -> np.ndarray:
            returns = greedy_returns(self.model, episodes, self.next_seed)
            self.next_seed += episodes
            return returns

        def _on_rollout_end(self) -> None:
            if self.num_timesteps <= ZOO["learning_starts"]:
                return
            started = time.monotonic()
            clock = started - launched - self.eval_seconds
            returns = self.play(EVAL_EPISODES)
            self.evals += 1
            if returns.mean() >= THRESHOLD and self.first_10 is None:
                self.first_10 = clock
            if returns.mean() > self.best:
                returns = np.concatenate([returns, self.play(CONFIRM_EPISODES)])
                if returns.mean() > self.best:
                    self.best = returns.mean()
                    self.best_state = copy.deepcopy(self.model.policy.state_dict())
            self.eval_seconds += time.monotonic() - started
            if self.best >= THRESHOLD and self.solved_at is None:
                self.solved_at = (clock, self.num_timesteps)

        def _on_step(self) -> bool:
            clock = time.monotonic() - launched - self.eval_seconds
            return self.solved_at is None and clock < budget

    callback = EvalAfterTraining()
    model = DQN("MlpPolicy", ENV, seed=seed, verbose=0, **ZOO)
    model.learn(total_timesteps=max_steps, callback=callback)
    solved = callback.solved_at is not None
    fresh = {}
    if solved:  # its best model, on the seeds apexrl's saved model is played on
        model.policy.load_state_dict(callback.best_state)
        returns = greedy_returns(model, FRESH_EPISODES, FRESH_SEED)
        fresh = {"fresh_100_mean": float(returns.mean()), "fresh_100_min": float(returns.min())}
    return {
        "system": "sb3-dqn-zoo", "seed": seed, "solved": solved,
        "seconds": round(callback.solved_at[0], 1) if solved else None,
        "env_steps": callback.solved_at[1] if solved else None,
        "first_10_episode_475_seconds": (
            round(callback.first_10, 1) if callback.first_10 is not None else None
        ),
        **fresh,
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
        "fresh_100_means": [r.get("fresh_100_mean") for r in solved],
        "fresh_100_worst": min((r.get("fresh_100_mean") or 0.0 for r in solved), default=None),
        "median_first_10_episode_475_seconds": statistics.median(
            [r["first_10_episode_475_seconds"] for r in runs]
        ) if all(r["first_10_episode_475_seconds"] is not None for r in runs) else None,
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
    summary["targets"] = (
        "apexrl median <= 20 s, solved on every seed, <= 0.5 x SB3 median;"
        " every saved best model >= 451 over 100 fresh episodes"
    )
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
