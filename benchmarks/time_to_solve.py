"""Time to solve: apexrl local mode against Stable-Baselines3, same protocol, side by side.

    .venv/bin/python benchmarks/time_to_solve.py --seeds 5                    # CartPole: DQN
    .venv/bin/python benchmarks/time_to_solve.py --task pendulum --seeds 5    # Pendulum: DPG vs TD3
    .venv/bin/python benchmarks/time_to_solve.py --task acrobot --only apexrl
    .venv/bin/python benchmarks/time_to_solve.py --seeds 5 \
        --task cartpole-ppo cartpole-impala acrobot-ppo acrobot-impala  # on-policy, side by side
    .venv/bin/python benchmarks/time_to_solve.py --seeds 5 --task pendulum-ppo pendulum-impala

Tasks: cartpole (CartPole-v1, target 475; apexrl dqn vs SB3 DQN), novelocity-r2d2 and
novelocity-dqn (apexrl/CartPoleNoVelocity-v1, 475: r2d2, and the feed-forward dqn beside it; no SB3
peer), cartpole-r2d2 (CartPole-v1, 475), cartpole-noisy, cartpole-c51, cartpole-rainbow,
cartpole-nec, acrobot-noisy and acrobot-c51 (dqn's options and the agents built on dqn, no SB3
peer: run the cartpole or acrobot task beside them, with --only apexrl), acrobot (Acrobot-v1, -100;
dqn vs SB3 DQN), pendulum (Pendulum-v1, -200, gymnasium gives it no threshold; apexrl dpg vs
SB3 TD3), mountaincar (MountainCarContinuous-v0, 90; dpg vs TD3), lunarlander
(LunarLanderContinuous-v3, 200, needs the `continuous` extra: box2d; dpg vs TD3). SB3 runs with
the rl-baselines3-zoo hyperparameters of the task (hyperparams/dqn.yml, td3.yml), but one: where
the zoo's TD3 trains every step (train_freq 1, gradient_steps 1) we train at each episode's end
with as many gradient steps as it had env steps (train_freq (1, "episode"), gradient_steps -1,
the zoo's own TD3 setting before 2024): the same updates per env step, and the evaluation after
each training round runs once per episode rather than once per step.

On-policy tasks: cartpole-ppo, cartpole-impala, cartpole-unreal, cartpole-reinforce, cartpole-a3c
(CartPole-v1, 475; reinforce and a3c have no SB3 peer: run cartpole-ppo beside them, with --only
apexrl),
acrobot-ppo, acrobot-impala (Acrobot-v1, -100) and, with Gaussian policies on continuous actions,
pendulum-ppo, pendulum-impala (Pendulum-v1, -200): apexrl ppo or impala against SB3 PPO with the
zoo's hyperparams/ppo.yml (Pendulum: the zoo's gSDE exploration for SB3, and for apexrl ppo,
whose preset has it; a plain Gaussian for impala) (its lin_X schedules decay over the zoo's n_timesteps; Acrobot under
VecNormalize, whose statistics at that moment normalize the greedy episodes' observations and
travel with the best model). apexrl runs local mode's settings for the algorithm (plus
`--apexrl-config`'s, for experiments). SB3's
model and training envs are seeded apart from the evaluation's seeds (TRAIN_SEED_OFFSET). For
these the figure is *training* time, from the first env step on both sides, start-up (launch to
first env step) reported on its own: apexrl's first env step is the actors' earliest first-step
gauge (local mode's `startup_seconds`; without it, the metrics.csv row before the first with
env steps), SB3's when `learn` starts. It ends where the policy that solved it was trained,
evaluation excluded on both sides: SB3's clock stops when it evaluates the policy it has just
trained (after the rollout it collected with it), minus all time spent evaluating; apexrl's
when its learner published the first version that its evaluator found to solve it
(`solving_version`, from the learner's log: local mode names the best model of its next 0.5 s
poll, possibly a later one), at the time interpolated between the metrics.csv rows (0.5 s
apart) before and after it published that version (`published_at`; the first row showing it
would be up to 0.5 s late, a quarter of a ppo CartPole median). As SB3's callback plays every
policy, local mode's evaluator plays every version in order (its on-policy `window`), but never
more than 30 behind the newest: the versions it skips to keep up (counted) may hold an earlier
solver (conservative). When local mode saw it solved (the evaluator's 10 + 50 episodes, its lag
and its report included) is `seen_solved_seconds`. One SB3 run per env and seed serves both of
an env's tasks in one run.

Protocol for both (apexrl's evaluator, reproduced for SB3): each new policy plays 10 greedy
episodes; one that beats the best score so far plays 50 more on fresh seeds and is scored by
the mean of all 60; it becomes the best model if that beats the best. Solved: the best model's
score reaches the target; the figure is wall seconds and env steps from launch to then. Time
spent evaluating is excluded for SB3 (training pauses while it evaluates after each training
round); apexrl evaluates in its own process concurrently, so its figure *includes* what the
evaluator costs the other processes on the shared cores (conservative). Each run also reports
when a single 10-episode evaluation first reached the target (the old, looser criterion), and
plays its saved best model for 100 episodes on seeds no evaluation used (from 1,000,000):
"solved" should hold there too (>= 95% of the target's distance from the env's worst; for
CartPole >= 451). Prints figures, never pass/fail.
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
import tomllib
from pathlib import Path

import numpy as np

EVAL_EPISODES, CONFIRM_EPISODES = 10, 50
FRESH_EPISODES, FRESH_SEED = 100, 1_000_000  # the saved model, on seeds no evaluation used
# SB3 seeds its model and training envs here, apart from the evaluation's seeds (which count up
# from the run's seed): seeded with the run's seed itself, PPO's training env k started from
# the state of evaluation episode k, a start it had already trained on. apexrl's actors seed
# their envs at random.
TRAIN_SEED_OFFSET = 100_000

ON_POLICY_TARGETS = (
    "solved on every seed, median training time (from the first env step) <= 1x SB3 PPO's median;"
    " every saved best model holds its score over 100 fresh episodes"
)
# SB3 PPO runs on one torch thread: its 64x64 networks gain nothing from two, and two threads on a
# loaded 2-core machine made a 2,560-step CartPole `learn` 20-40x slower (25-55 s against 1 s).
# hyperparams/ppo.yml, CartPole-v1 (learning_rate and clip_range: lin_1e-3, lin_0.2)
PPO_CARTPOLE = dict(
    env="CartPole-v1", target=475.0, sb3="PPO", zoo_timesteps=100_000, n_envs=8,
    zoo=dict(n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20, ent_coef=0.0),
    zoo_linear=dict(learning_rate=1e-3, clip_range=0.2), from_first_step=True, sb3_threads=1,
    targets=ON_POLICY_TARGETS,
)  # fmt: skip
# hyperparams/ppo.yml, Acrobot-v1 (batch_size: SB3's default, 64)
PPO_ACROBOT = dict(
    env="Acrobot-v1", target=-100.0, sb3="PPO", zoo_timesteps=1_000_000, n_envs=16,
    normalize=True,
    zoo=dict(n_steps=256, gae_lambda=0.94, gamma=0.99, n_epochs=4, ent_coef=0.0),
    from_first_step=True, sb3_threads=1,
    targets=ON_POLICY_TARGETS,
)  # fmt: skip

# hyperparams/ppo.yml, Pendulum-v1 (batch_size: SB3's default, 64), gSDE included
PENDULUM_ZOO = dict(
    n_steps=1024,
    gae_lambda=0.95,
    gamma=0.9,
    n_epochs=10,
    ent_coef=0.0,
    learning_rate=1e-3,
    clip_range=0.2,
    use_sde=True,
    sde_sample_freq=4,
)
PPO_PENDULUM = dict(
    env="Pendulum-v1",
    target=-200.0,
    sb3="PPO",
    zoo_timesteps=100_000,
    n_envs=4,
    zoo=PENDULUM_ZOO,
    from_first_step=True,
    sb3_threads=1,
    targets=ON_POLICY_TARGETS,
)

R2D2_TARGETS = (
    "r2d2: solved on every seed within 300 s, every saved best model holding its"
    " score over 100 fresh episodes; dqn beside it on the same env and budget"
)
NO_VELOCITY = dict(env="apexrl/CartPoleNoVelocity-v1", target=475.0, sb3=None,
                   targets=R2D2_TARGETS)  # fmt: skip
# dqn's options and the agents built on dqn, against dqn on the same env (run its task beside).
OPTION_TARGETS = "solved on every seed; time against the dqn task's on the same seeds"
NEC_TARGETS = "solved on every seed in at most half the env steps of the cartpole task's dqn"
UNREAL_TARGETS = "solved on every seed within 1.5x the cartpole-impala task's time"
REINFORCE_TARGETS = "solved on every seed; training time against the cartpole-ppo task's"
A3C_TARGETS = REINFORCE_TARGETS
BETA_TARGETS = "solved on every seed; no slower than the cartpole task's dqn (beta 0.4 throughout)"
C51 = ["--distributional", "--v-min", "-100", "--v-max", "100"]  # returns up to 500 or -500
CARTPOLE = dict(env="CartPole-v1", target=475.0, sb3=None, targets=OPTION_TARGETS)
ACROBOT = dict(env="Acrobot-v1", target=-100.0, sb3=None, targets=OPTION_TARGETS)

# Per task: env, target, apexrl's algorithm, the SB3 peer with its rl-baselines3-zoo settings.
TASKS = {
    "cartpole": dict(
        env="CartPole-v1", target=475.0, algorithm="dqn", sb3="DQN", zoo_timesteps=50_000,
        # hyperparams/dqn.yml, CartPole-v1
        zoo=dict(learning_rate=2.3e-3, batch_size=64, buffer_size=100_000, learning_starts=1000,
                 gamma=0.99, target_update_interval=10, train_freq=256, gradient_steps=128,
                 exploration_fraction=0.16, exploration_final_eps=0.04,
                 policy_kwargs=dict(net_arch=[256, 256])),
    ),
    "acrobot": dict(
        env="Acrobot-v1", target=-100.0, algorithm="dqn", sb3="DQN", zoo_timesteps=100_000,
        # hyperparams/dqn.yml, Acrobot-v1
        zoo=dict(learning_rate=6.3e-4, batch_size=128, buffer_size=50_000, learning_starts=0,
                 gamma=0.99, target_update_interval=250, train_freq=4, gradient_steps=-1,
                 exploration_fraction=0.12, exploration_final_eps=0.1,
                 policy_kwargs=dict(net_arch=[256, 256])),
    ),
    "pendulum": dict(
        env="Pendulum-v1", target=-200.0, algorithm="dpg", sb3="TD3", zoo_timesteps=20_000,
        # hyperparams/td3.yml, Pendulum-v1 (noise: normal, std 0.1)
        zoo=dict(learning_rate=1e-3, buffer_size=200_000, learning_starts=10_000, gamma=0.98,
                 train_freq=(1, "episode"), gradient_steps=-1,
                 policy_kwargs=dict(net_arch=[400, 300])),
        noise_std=0.1,
    ),
    "mountaincar": dict(
        env="MountainCarContinuous-v0", target=90.0, algorithm="dpg", sb3="TD3",
        zoo_timesteps=300_000,
        # hyperparams/td3.yml, MountainCarContinuous-v0 (train_freq and gradient_steps: see above;
        # learning_starts: SB3's default, the zoo sets none)
        zoo=dict(learning_rate=1e-3, batch_size=256, learning_starts=100,
                 train_freq=(1, "episode"), gradient_steps=-1,
                 policy_kwargs=dict(net_arch=[400, 300])),
        noise="ornstein-uhlenbeck", noise_std=0.5,
    ),
    "lunarlander": dict(
        env="LunarLanderContinuous-v3", target=200.0, algorithm="dpg", sb3="TD3",
        zoo_timesteps=300_000,
        # hyperparams/td3.yml, LunarLanderContinuous-v3 (train_freq and gradient_steps: see above)
        zoo=dict(learning_rate=1e-3, buffer_size=200_000, learning_starts=10_000, gamma=0.98,
                 train_freq=(1, "episode"), gradient_steps=-1,
                 policy_kwargs=dict(net_arch=[400, 300])),
        noise_std=0.1,
    ),
    # Partially observed: no SB3 peer; apexrl's feed-forward dqn is the one to run beside r2d2.
    "novelocity-r2d2": NO_VELOCITY | dict(algorithm="r2d2"),
    "novelocity-dqn": NO_VELOCITY | dict(algorithm="dqn"),
    "cartpole-r2d2": dict(env="CartPole-v1", target=475.0, algorithm="r2d2", sb3=None,
                          targets=R2D2_TARGETS),
    "cartpole-noisy": CARTPOLE | dict(algorithm="dqn", flags=["--noisy"]),
    "cartpole-c51": CARTPOLE | dict(algorithm="dqn", flags=C51),
    "cartpole-rainbow": CARTPOLE | dict(algorithm="rainbow"),
    # PER's beta annealed to 1 over about the updates the cartpole task's dqn solves in (~4K).
    "cartpole-beta": CARTPOLE | dict(algorithm="dqn", targets=BETA_TARGETS,
                                     toml='[learner]\nbeta = { linear = [0.4, 1.0], over = "4K updates" }\n'),
    "cartpole-nec": CARTPOLE | dict(algorithm="nec", targets=NEC_TARGETS),
    "acrobot-noisy": ACROBOT | dict(algorithm="dqn", flags=["--noisy"]),
    "acrobot-c51": ACROBOT | dict(algorithm="dqn", flags=C51),
    "cartpole-ppo": PPO_CARTPOLE | dict(algorithm="ppo"),
    "cartpole-impala": PPO_CARTPOLE | dict(algorithm="impala"),
    "cartpole-unreal": PPO_CARTPOLE | dict(algorithm="unreal", targets=UNREAL_TARGETS),
    "cartpole-reinforce": PPO_CARTPOLE | dict(algorithm="reinforce", sb3=None,
                                              targets=REINFORCE_TARGETS),
    "cartpole-a3c": PPO_CARTPOLE | dict(algorithm="a3c", sb3=None, targets=A3C_TARGETS),
    "acrobot-a3c": PPO_ACROBOT | dict(algorithm="a3c", sb3=None, targets=A3C_TARGETS),
    "pendulum-a3c": PPO_PENDULUM | dict(algorithm="a3c", sb3=None, targets="solved on 3/3 seeds"),
    "acrobot-ppo": PPO_ACROBOT | dict(algorithm="ppo"),
    "acrobot-impala": PPO_ACROBOT | dict(algorithm="impala"),
    "pendulum-ppo": PPO_PENDULUM | dict(algorithm="ppo"),
    "pendulum-impala": PPO_PENDULUM | dict(algorithm="impala", targets="solved on every seed"),
}  # fmt: skip


def check_apexrl_config(task: dict, config: Path) -> None:
    """Exits naming the setting where local mode would refuse --apexrl-config for the task: a
    setting in another table than its own (n_step in [learner], not [dqn]; the table's sizes in
    [replay], not the algorithm's table), or a key no table has."""
    from apexrl import algorithms
    from apexrl import config as cfg
    from apexrl.local.settings import parse
    from apexrl.local.supervision import Run

    argv = ["--config", str(config), "--algorithm", task["algorithm"], "--env", task["env"],
            *task.get("flags", [])]  # fmt: skip
    settings = parse(argv)
    with tempfile.TemporaryDirectory(prefix="apexrl-tts-check-") as folder:
        try:
            run = Run(settings, tomllib.loads(config.read_text()), Path(folder))
        except ValueError as err:
            sys.exit(f"--apexrl-config {config}: {err}")
        # The file local mode writes, as each service reads it (argparse exits naming the key).
        services = {"replay": cfg.ReplayConfig, "learner": cfg.LearnerConfig,
                    "actor": cfg.ActorConfig, "evaluator": cfg.EvaluatorConfig}  # fmt: skip
        for section, service in services.items():
            cfg.parse(service, ["--config", str(run.config_path)], section,
                      f"apexrl {section} (--apexrl-config {config})", algorithms.REGISTRY)  # fmt: skip


def run_apexrl(task: dict, seed: int, budget: float, workdir: Path, config: Path | None) -> dict:
    run_dir = workdir / f"apexrl-{task['env']}-{seed}"
    if config is None and "toml" in task:  # the task's own settings, as a config file
        config = workdir / f"apexrl-{task['env']}-{seed}.toml"
        config.write_text(task["toml"])
    settings = ["--config", str(config)] if config else []  # --apexrl-config or the task's
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "apexrl.cli", "local", "--run-dir", str(run_dir), "--seed", str(seed),
         "--max-seconds", str(budget), "--algorithm", task["algorithm"], "--env", task["env"],
         "--target-return", str(task["target"]), *task.get("flags", []), *settings],
        capture_output=True, text=True, timeout=budget + 300,
    )  # fmt: skip
    wall = time.monotonic() - started
    last = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else result.stderr[-500:]
    match = re.match(r"solved in ([\d.]+) s \(([\d,]+) env steps\) by version (\d+)", last)
    rows = []  # none when local mode failed before it began monitoring: `last_line` says why
    if (run_dir / "metrics.csv").exists():
        with open(run_dir / "metrics.csv") as fh:
            rows = list(csv.DictReader(fh))
    seconds = float(rows[-1]["seconds"]) if rows else 0.0
    # On-policy tasks count from the first env step: the row before the first with env steps.
    # Where the first row already has some, stepping began at an unknown time: count from launch.
    stepping = next((i for i, r in enumerate(rows) if float(r["env_steps"]) > 0), None)
    startup = float(rows[stepping - 1]["seconds"]) if stepping else None
    # Local mode records the first env step itself (startup_seconds, from the actors' gauge).
    recorded = [float(r["startup_seconds"]) for r in rows if r.get("startup_seconds") not in
                (None, "", "nan")]  # fmt: skip
    if recorded:
        startup = recorded[0]
    zero = startup if task.get("from_first_step") and startup is not None else 0.0
    first_10 = next(
        (
            r
            for r in rows
            if float(r["eval_rounds"]) and float(r["eval_mean_return"]) >= task["target"]
        ),
        None,
    )
    fresh = fresh_apexrl(run_dir / "checkpoints") if match else {}
    solved_at = (float(match.group(1)), int(match.group(2).replace(",", ""))) if match else None
    clock = {}
    if task.get("from_first_step"):
        clock = {
            "seconds_from_launch": solved_at[0] if match else None,
            "startup_seconds": round(startup, 1) if startup is not None else None,
            "seconds_counted_from": "first env step" if startup is not None else "launch",
        }
        if match:
            # Training time, as SB3's clock counts it (evaluation excluded): until the learner
            # published the solving version (interpolated between the rows around it).
            version = first_solving_version(run_dir, task["target"], int(match.group(3)))
            clock["solving_version"] = version
            clock["seen_solved_seconds"] = round(solved_at[0] - zero, 3)  # evaluation included
            solved_at = published_at(rows, version)
    return {
        "system": f"apexrl-{task['algorithm']}", "env": task["env"], "seed": seed,
        "solved": bool(match),
        "seconds": round(solved_at[0] - zero, 3) if match else None,
        "env_steps": solved_at[1] if match else None,
        "first_10_episode_target_seconds": (
            round(float(first_10["seconds"]) - zero, 3) if first_10 else None
        ),
        **clock,
        **fresh,
        "process_wall_seconds": round(wall, 1),
        "env_steps_per_s": round(float(rows[-1]["env_steps"]) / seconds, 1) if seconds else 0.0,
        "updates_per_s": round(float(rows[-1]["updates"]) / seconds, 1) if seconds else 0.0,
        "last_line": last,
        **crashed_log(run_dir, last),
    }  # fmt: skip


def crashed_log(run_dir: Path, last: str) -> dict:
    """The end of the log of a process that ended the run by exiting (the run's folder goes
    with the benchmark's temporary one)."""
    dead = re.match(r"not solved: (\S+) exited with code", last)
    log = run_dir / "logs" / f"{dead.group(1)}.log" if dead else None
    return {"crashed_log_tail": log.read_text()[-3000:]} if log and log.exists() else {}


def published_at(rows: list[dict], version: int) -> tuple[float, int]:
    """(seconds, env steps) when the learner published `version`, interpolated between the
    metrics.csv rows (0.5 s apart) around it: the last showing an older version and the first
    showing it or a newer one (versions come at a steady rate, ~20 a second for ppo)."""
    after = next(i for i, r in enumerate(rows) if float(r["parameter_version"]) >= version)
    points = [rows[max(after - 1, 0)], rows[after]]
    seconds, steps, versions = (
        [float(r[name]) for r in points] for name in ("seconds", "env_steps", "parameter_version")
    )
    share = (version - versions[0]) / (versions[1] - versions[0]) if after else 1.0
    return (
        seconds[0] + share * (seconds[1] - seconds[0]),
        int(steps[0] + share * (steps[1] - steps[0])),
    )


def first_solving_version(run_dir: Path, target: float, reported: int) -> int:
    """The first version the learner kept as its best model with a score reaching the target,
    from its log. Local mode names the best model at its next 0.5 s poll: with the evaluator
    playing every version, a later, better one may have replaced the first solver by then,
    while SB3's clock stops at its first. The log rounds scores to 0.1: only one that reaches
    target + 0.05 surely reached the target (else the reported version, conservative)."""
    kept = re.compile(r"best model: version (\d+) .*mean return (-?[\d.]+) over")
    for line in (run_dir / "logs" / "learner.log").read_text().splitlines():
        found = kept.search(line)
        if found and float(found.group(2)) >= target + 0.05:
            return min(int(found.group(1)), reported)
    return reported


def fresh_apexrl(checkpoints: Path) -> dict:
    """`apexrl eval` (the user's command) on the saved best model, 100 fresh episodes."""
    played = subprocess.run(
        [sys.executable, "-m", "apexrl.cli", "eval", "--checkpoint", str(checkpoints),
         "--episodes", str(FRESH_EPISODES), "--seed", str(FRESH_SEED)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    version = re.search(r", version (\d+) ", played.stdout)
    mean = re.search(r"^mean (-?[\d.]+), min (-?[\d.]+)", played.stdout, re.M)
    if played.returncode != 0 or not version or not mean:
        return {"fresh_error": (played.stdout + played.stderr)[-500:]}
    return {
        "best_version": int(version.group(1)),
        "fresh_100_mean": float(mean.group(1)),
        "fresh_100_min": float(mean.group(2)),
    }


def greedy_returns(model, env: str, episodes: int, seed: int, vec_normalize=None) -> np.ndarray:
    """Returns of `episodes` greedy episodes, episode k on seed `seed + k` (as apexrl's); the
    policy sees observations normalized by `vec_normalize`'s statistics (never updated here)."""
    import gymnasium as gym

    envs = gym.vector.SyncVectorEnv([lambda: gym.make(env) for _ in range(episodes)])
    obs, _ = envs.reset(seed=seed)
    returns, running = np.zeros(episodes), np.ones(episodes, bool)
    while running.any():
        seen = vec_normalize.normalize_obs(obs) if vec_normalize is not None else obs
        actions, _ = model.predict(seen, deterministic=True)
        obs, rewards, terminated, truncated, _ = envs.step(actions)
        returns += rewards * running
        running &= ~(terminated | truncated)
    envs.close()
    return returns


def zoo_linear(initial: float, zoo_timesteps: int, max_steps: int):
    """The zoo's lin_X: X times the progress remaining over *its* n_timesteps, 0 past them (SB3
    measures progress over `learn`'s total, `max_steps`)."""
    return lambda remaining: initial * max(0.0, 1.0 - (1.0 - remaining) * max_steps / zoo_timesteps)


def run_sb3(task: dict, seed: int, budget: float, max_steps: int, threads: int) -> dict:
    import stable_baselines3
    import torch
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.noise import NormalActionNoise, OrnsteinUhlenbeckActionNoise
    from stable_baselines3.common.vec_env import VecNormalize

    torch.set_num_threads(threads)
    launched = time.monotonic()

    class EvalAfterTraining(BaseCallback):
        """Evaluates after each training round (the policy changes only then), off the clock."""

        def __init__(self):
            super().__init__()
            self.eval_seconds, self.solved_at, self.evals = 0.0, None, 0
            self.first_10, self.best, self.best_state = None, -np.inf, None
            self.best_obs_rms = None  # VecNormalize's statistics when the best model was taken
            self.next_seed = seed  # apexrl's evaluator counts up from the run's seed too
            self.clock_zero, self.startup = launched, None

        def _on_training_start(self) -> None:
            if task.get("from_first_step"):  # the clock starts at the first env step
                self.clock_zero = time.monotonic()
                self.startup = self.clock_zero - launched

        def play(self, episodes: int) -> np.ndarray:
            returns = greedy_returns(
                self.model, task["env"], episodes, self.next_seed, vec_normalize
            )
            self.next_seed += episodes
            return returns

        def _on_rollout_end(self) -> None:
            # PPO has no learning_starts: one evaluation per rollout (it trains after each)
            if self.num_timesteps <= task["zoo"].get("learning_starts", 0):
                return
            started = time.monotonic()
            clock = started - self.clock_zero - self.eval_seconds
            returns = self.play(EVAL_EPISODES)
            self.evals += 1
            if returns.mean() >= task["target"] and self.first_10 is None:
                self.first_10 = clock
            if returns.mean() > self.best:
                returns = np.concatenate([returns, self.play(CONFIRM_EPISODES)])
                if returns.mean() > self.best:
                    self.best = returns.mean()
                    self.best_state = copy.deepcopy(self.model.policy.state_dict())
                    if vec_normalize is not None:  # the model is only whole with its statistics
                        self.best_obs_rms = copy.deepcopy(vec_normalize.obs_rms)
            self.eval_seconds += time.monotonic() - started
            if self.best >= task["target"] and self.solved_at is None:
                self.solved_at = (clock, self.num_timesteps)

        def _on_step(self) -> bool:
            clock = time.monotonic() - self.clock_zero - self.eval_seconds
            return self.solved_at is None and clock < budget

    callback = EvalAfterTraining()
    settings = dict(task["zoo"])
    if "noise_std" in task:  # as the zoo builds it: sigma = noise_std per action dimension
        import gymnasium as gym

        size = gym.make(task["env"]).action_space.shape[0]
        noise = {"normal": NormalActionNoise, "ornstein-uhlenbeck": OrnsteinUhlenbeckActionNoise}
        settings["action_noise"] = noise[task.get("noise", "normal")](
            np.zeros(size), task["noise_std"] * np.ones(size)
        )
    for name, initial in task.get("zoo_linear", {}).items():
        settings[name] = zoo_linear(initial, task["zoo_timesteps"], max_steps)
    env, vec_normalize = task["env"], None
    if "n_envs" in task:
        env = make_vec_env(task["env"], n_envs=task["n_envs"], seed=seed + TRAIN_SEED_OFFSET)
        if task.get("normalize"):  # the zoo's `normalize: true`: observations and rewards
            env = vec_normalize = VecNormalize(env, gamma=task["zoo"]["gamma"])
    algorithm = getattr(stable_baselines3, task["sb3"])
    model = algorithm("MlpPolicy", env, seed=seed + TRAIN_SEED_OFFSET, verbose=0, **settings)
    model.learn(total_timesteps=max_steps, callback=callback)
    solved = callback.solved_at is not None
    fresh = {}
    if solved:  # its best model, on the seeds apexrl's saved model is played on
        model.policy.load_state_dict(callback.best_state)
        if vec_normalize is not None:
            vec_normalize.obs_rms = callback.best_obs_rms
        returns = greedy_returns(model, task["env"], FRESH_EPISODES, FRESH_SEED, vec_normalize)
        fresh = {"fresh_100_mean": float(returns.mean()), "fresh_100_min": float(returns.min())}
    return {
        "system": f"sb3-{task['sb3'].lower()}-zoo", "env": task["env"], "seed": seed,
        "solved": solved,
        "seconds": round(callback.solved_at[0], 1) if solved else None,
        "env_steps": callback.solved_at[1] if solved else None,
        "first_10_episode_target_seconds": (
            round(callback.first_10, 1) if callback.first_10 is not None else None
        ),
        **({"startup_seconds": round(callback.startup, 1)} if callback.startup is not None else {}),
        **fresh,
        "eval_seconds_excluded": round(callback.eval_seconds, 1), "evaluations": callback.evals,
        # what an unsolved run reached: the best model's score, after how many env steps
        "best_score": round(float(callback.best), 1) if callback.best_state is not None else None,
        "env_steps_done": model.num_timesteps,
    }  # fmt: skip


def summarize(runs: list[dict]) -> dict:
    solved = [r for r in runs if r["solved"]]
    seconds = [r["seconds"] for r in solved]
    startups = [r["startup_seconds"] for r in runs if r.get("startup_seconds") is not None]
    startup = {"median_startup_seconds": statistics.median(startups)} if startups else {}
    seen = [r["seen_solved_seconds"] for r in solved if "seen_solved_seconds" in r]
    if seen and len(solved) == len(runs):  # when local mode saw it, evaluation included
        startup["median_seen_solved_seconds"] = statistics.median(seen)
    return {
        "seeds": len(runs), "solved": len(solved),
        "median_seconds": statistics.median(seconds) if len(solved) == len(runs) else None,
        "worst_seconds": max(seconds) if len(solved) == len(runs) else None,
        "median_env_steps": statistics.median(r["env_steps"] for r in solved) if solved else None,
        "fresh_100_means": [r.get("fresh_100_mean") for r in solved],
        "fresh_100_worst": min((r.get("fresh_100_mean") or 0.0 for r in solved), default=None),
        "median_first_10_episode_target_seconds": statistics.median(
            [r["first_10_episode_target_seconds"] for r in runs]
        ) if all(r["first_10_episode_target_seconds"] is not None for r in runs) else None,
        **startup,
    }  # fmt: skip


def side_by_side(summaries: list[dict]) -> str:
    """One line per task: medians (seconds, from the first env step where the task says so),
    solved counts, apexrl's start-up, apexrl / SB3."""

    def cell(value, unit: str = " s") -> str:
        return "-" if value is None else f"{value:.1f}{unit}"

    lines = [
        f"{'task':<16} {'apexrl median':>13} {'solved':>6} {'start-up':>8}"
        f" {'SB3 median':>10} {'solved':>6} {'apexrl/SB3':>10}"
    ]
    for summary in summaries:
        ours, peer = summary.get("apexrl", {}), summary.get("sb3", {})
        ratio = summary.get("apexrl_over_sb3_median")
        lines.append(
            f"{summary['task']:<16} {cell(ours.get('median_seconds')):>13}"
            f" {ours.get('solved', 0)}/{ours.get('seeds', 0):<4}"
            f" {cell(ours.get('median_startup_seconds')):>8}"
            f" {cell(peer.get('median_seconds')):>10} {peer.get('solved', 0)}/{peer.get('seeds', 0):<4}"
            f" {'-' if ratio is None else f'{ratio:.3f}':>10}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--task", nargs="+", choices=sorted(TASKS), default=["cartpole"], help="one or several"
    )
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument(
        "--budget", type=float, default=300.0, help="seconds per run before 'not solved'"
    )
    parser.add_argument(
        "--sb3-max-steps",
        type=int,
        default=0,
        help="SB3 env step budget (default 4x the zoo's: extra lets late solvers count; 1x"
        " where the zoo's schedules decay to 0 over its n_timesteps)",
    )
    parser.add_argument(
        "--sb3-threads",
        type=int,
        default=0,
        help="torch threads for SB3 (default the task's: 2, SB3 is one process and may use both"
        " cores; 1 for the on-policy tasks)",
    )
    parser.add_argument("--only", choices=["apexrl", "sb3"])
    parser.add_argument(
        "--apexrl-config",
        type=Path,
        help="a TOML of local-mode settings for apexrl, over local mode's: a service's in its"
        " table ([learner] ...), the algorithm's in its own ([dqn] n_step, [ppo] epochs, ...)",
    )
    args = parser.parse_args()
    if args.apexrl_config:  # a file local mode refuses fails here, not in every run
        args.apexrl_config = args.apexrl_config.resolve()
        for name in args.task:
            check_apexrl_config(TASKS[name], args.apexrl_config)
    summaries = []
    peers: dict[tuple, dict] = {}  # (SB3 algorithm, env, seed): one run serves every task with it
    for name in args.task:
        task = TASKS[name]
        zoo_steps = task.get("zoo_timesteps", 0) * (1 if "zoo_linear" in task else 4)
        max_steps = args.sb3_max_steps or zoo_steps
        results: dict[str, list[dict]] = {"apexrl": [], "sb3": []}
        with tempfile.TemporaryDirectory(prefix="apexrl-tts-") as tmp:
            for seed in range(1, args.seeds + 1):
                if args.only in (None, "apexrl"):
                    results["apexrl"].append(
                        run_apexrl(task, seed, args.budget, Path(tmp), args.apexrl_config)
                    )
                    print(json.dumps(results["apexrl"][-1]), flush=True)
                if args.only in (None, "sb3") and task["sb3"]:
                    key = (task["sb3"], task["env"], seed)
                    if key not in peers:
                        threads = args.sb3_threads or task.get("sb3_threads", 2)
                        peers[key] = run_sb3(task, seed, args.budget, max_steps, threads)
                        print(json.dumps(peers[key]), flush=True)
                    results["sb3"].append(peers[key])
        summary = {"task": name} | {system: summarize(r) for system, r in results.items() if r}
        if "apexrl" in summary and "sb3" in summary and summary["sb3"]["median_seconds"]:
            ours, peer = summary["apexrl"]["median_seconds"], summary["sb3"]["median_seconds"]
            summary["apexrl_over_sb3_median"] = round(ours / peer, 3) if ours else None
        summary["targets"] = task.get("targets", (
            "solved on every seed, median <= 0.5 x SB3 median (cartpole: <= 20 s);"
            " every saved best model holds its score over 100 fresh episodes"
        ))  # fmt: skip
        print(json.dumps(summary), flush=True)
        summaries.append(summary)
    print(side_by_side(summaries))


if __name__ == "__main__":
    main()
