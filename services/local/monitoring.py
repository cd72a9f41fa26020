"""Local mode's progress: each row of metrics.csv, scraped from the children's /metrics, printed
as it comes, until the best model reaches the target or the budget runs out."""

import csv
import math
import sys
import time

from apexrl.command_config import LocalConfig
from apexrl.local.supervision import Run


def _format_count(n: float) -> str:
    return f"{n:,.0f}"


FIELDS = [
    "seconds",
    "startup_seconds",
    "env_steps",
    "env_steps_per_s",
    "updates",
    "updates_per_s",
    "replay_size",
    "replay_bytes_per_item",
    "actor_mean_return",
    "eval_mean_return",
    "eval_rounds",
    "eval_best_mean_return",
    "eval_best_version",
    "parameter_version",
    "parameter_bytes",
    "parameter_change_bytes",
    "loss",
    "prefetch_wait_fraction",
    "transitions_dropped",
]


def monitor(
    run: Run, config: LocalConfig, target: float, rows: list[dict], stop, started, scalars
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
            row = collect(run, time.monotonic() - started, previous)
            rows.append(row)
            writer.writerow(row)
            fh.flush()
            if scalars is not None:
                scalars.add(row, int(row["env_steps"]))
            previous = row
            if tty or row["seconds"] - last_print >= 5:
                line = (
                    f"{row['seconds']:6.1f} s  env steps {_format_count(row['env_steps'])} "
                    f"({_format_count(row['env_steps_per_s'])}/s)  updates {_format_count(row['updates'])} "
                    f"({_format_count(row['updates_per_s'])}/s)  replay {_format_count(row['replay_size'])}  "
                    f"eval {row['eval_mean_return']:.1f}"
                )
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
                return unsolved_line(rows, target), 1
    return "", 130


def unsolved_line(rows: list[dict], target: float) -> str:
    """The last line of a run out of budget: its best model's score (the full protocol's) under
    the target, and the best single evaluation round where one scored higher (a round at or
    above the target whose confirming episodes pulled the mean back under it)."""
    last = rows[-1]
    head = f"not solved in {last['seconds']:.1f} s ({_format_count(last['env_steps'])} env steps)"
    best_round = max((r["eval_mean_return"] for r in rows), key=_score)
    if math.isnan(best_round):
        return f"{head}: no evaluation yet"
    if last["eval_best_version"] <= 0:
        return f"{head}: no best model yet; best evaluation round {best_round:.1f}"
    best = last["eval_best_mean_return"]
    line = f"{head}: best model {best:.1f} < {target:g} (version {last['eval_best_version']:.0f})"
    if best_round > best:
        line += f"; best evaluation round {best_round:.1f}, not held by its confirming episodes"
    return line


def _score(value: float) -> float:
    """Orders scores with NaN (no evaluation yet) below every real one."""
    return -math.inf if math.isnan(value) else value


def collect(run: Run, seconds: float, previous: dict | None) -> dict:
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
        earlier = previous[key] if previous else 0.0
        row[f"{key}_per_s"] = round((row[key] - earlier) / dt, 1) if dt > 0 else 0.0
    return row
