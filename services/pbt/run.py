"""`apexrl pbt`: a population of local-mode runs in one folder (member-0, member-1, ...), each
row of their metrics.csv as local mode's, an exploit/explore round every `interval` seconds
(controller.py decides, members.py copies), every member's lineage in lineage.jsonl, until any
member's best model reaches the target (the same "solved" line as local mode's) or the budget
runs out. SIGTERM stops every member and exits 0."""

import dataclasses
import json
import logging
import math
import os
import random
import signal
import sys
import threading
import time
import tomllib
from pathlib import Path

from apexrl.algorithms.envs import default_target
from apexrl.command_config import LocalConfig, PbtConfig
from apexrl.common import checkpoint
from apexrl.config import env_name
from apexrl.learner.checkpoint import KIND as LEARNER
from apexrl.local.run import best_model
from apexrl.local.settings import parse_as
from apexrl.local.supervision import Run, stop_on_signals
from apexrl.pbt import controller
from apexrl.pbt import settings as pbt_settings
from apexrl.pbt.members import Member, copy_state

log = logging.getLogger(__name__)

LINEAGE = "lineage.jsonl"  # one JSON object a line: each member's start, then every exploit
PROG = "apexrl pbt"
LOCAL_SETTINGS = {f.name for f in dataclasses.fields(LocalConfig)}
POPULATION_SETTINGS = [
    f.name for f in dataclasses.fields(PbtConfig) if f.name not in LOCAL_SETTINGS
]


class Population:
    def __init__(self, config: PbtConfig, members: list[Member], directory: Path, rng, explore):
        self.config, self.members, self.directory, self.rng = config, members, directory, rng
        self.rules, self.explore = explore
        self.round = 0
        self.next_round = config.interval
        self.lineage = open(directory / LINEAGE, "w")  # noqa: SIM115

    def record(self, entry: dict) -> None:
        self.lineage.write(json.dumps(entry) + "\n")
        self.lineage.flush()

    def step(self, seconds: float, target: float, stop: threading.Event) -> str:
        """One row per member, then a round when one is due; the solved line (empty: not yet).
        RuntimeError naming the member when one of its processes exited."""
        for member in self.members:
            member.poll()
            dead = member.run.dead_child()
            if dead is not None:
                raise RuntimeError(
                    f"{member.name}'s {dead.name} exited with code {dead.process.returncode}"
                    f" (see {member.run.run_dir}/logs/{dead.name}.log)"
                )
        rows = [member.progress(seconds) for member in self.members]
        solvers = [
            (row["eval_best_mean_return"], member)
            for row, member in zip(rows, self.members, strict=True)
            if row["eval_best_version"] > 0 and row["eval_best_mean_return"] >= target
        ]
        if solvers:
            score, member = max(solvers, key=lambda s: s[0])
            row = member.rows[-1]
            return (
                f"solved in {seconds:.1f} s ({self.env_steps():,.0f} env steps, all members)"
                f" by {member.name} version {row['eval_best_version']:.0f} (mean return"
                f" {score:.1f}); {best_model(member.checkpoint_dir)}"
            )
        if seconds >= self.next_round and not stop.is_set():
            self.exploit_round(seconds, stop)
            self.next_round = seconds + self.config.interval
        return ""

    def env_steps(self) -> float:
        return sum(m.rows[-1]["env_steps"] for m in self.members if m.rows)

    def exploit_round(self, seconds: float, stop: threading.Event) -> None:
        self.round += 1
        seen = [controller.Member(m.index, m.score, m.settings) for m in self.members]
        for decision in controller.decide(seen, self.explore, self.rules, self.rng):
            self.exploit(decision, seconds, stop)

    def exploit(self, decision: controller.Exploit, seconds: float, stop) -> None:
        """The loser stopped, the winner's newest checkpoint copied with the explored settings,
        the lineage recorded, the loser started again."""
        loser, winner = self.members[decision.loser], self.members[decision.winner]
        if not checkpoint.checkpoints(winner.checkpoint_dir, LEARNER):
            log.info("round %d: %s has no checkpoint yet: no copy", self.round, winner.name)
            return
        record = {
            "round": self.round,
            "seconds": round(seconds, 3),
            "member": loser.name,
            "copied_from": winner.name,
            "scores": {loser.name: loser.score, winner.name: winner.score},
            "settings": decision.settings,
            "explore": decision.how,
        }
        loser.stop()
        copied = copy_state(winner.checkpoint_dir, loser.checkpoint_dir, decision.settings, record)
        if copied is None:  # cannot happen while the winner only adds checkpoints
            raise RuntimeError(f"{winner.name}'s checkpoints vanished during a copy")
        loser.settings = dict(decision.settings)
        copy = {key: copied[key] for key in ("path", "version", "update_step")}
        self.record({**record, **copy, "source": copied["pbt"]["source"]})
        loser.restarted(seconds, copied["update_step"])
        print(
            f"round {self.round}: {loser.name} ({loser_score(record, loser.name)}) goes on from"
            f" {winner.name}'s version {copied['version']} with {describe(decision)}",
            flush=True,
        )
        if not stop.is_set():
            loser.launch()


def stop_all(members: list[Member]) -> None:
    """Every member stopped at once (stopping is mostly waiting for the processes)."""
    threads = [threading.Thread(target=member.stop) for member in members]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def loser_score(record: dict, name: str) -> str:
    score = record["scores"][name]
    return "no score" if math.isnan(score) else f"score {score:.1f}"


def describe(decision: controller.Exploit) -> str:
    return ", ".join(
        f"{name} {value:.3g} ({decision.how[name]})" for name, value in decision.settings.items()
    )


def read_user_file(argv: list[str]) -> dict:
    path = os.environ.get("APEXRL_CONFIG", "")
    if "--config" in argv:
        path = argv[argv.index("--config") + 1]
    if not path:
        return {}
    with open(path, "rb") as fh:
        return tomllib.load(fh)


def setup(argv: list[str]) -> tuple[PbtConfig, Population, float]:
    """The population, its folder and members made (no process yet), and the target;
    ValueError naming a setting that can never work, before any folder exists."""
    config = parse_as(PbtConfig, argv, "pbt")
    user_file = read_user_file(argv)
    # The population's own settings are not the members': APEXRL_INTERVAL would otherwise
    # reach every member's evaluator (its `interval`) through the environment they inherit.
    for name in POPULATION_SETTINGS:
        os.environ.pop(env_name(name), None)
    rules, explore = pbt_settings.check(config)
    target = (
        default_target(config.env) if math.isnan(config.target_return) else config.target_return
    )
    if target is None:
        raise ValueError(f"target_return: {config.env} has no reward_threshold: pass one")
    directory = Path(config.run_dir or f"runs/pbt-{config.env}-{time.strftime('%Y%m%d-%H%M%S')}")
    rng = random.Random(config.seed or None)
    members = []
    for index, own in enumerate(pbt_settings.initial_settings(explore, config.population, rng)):
        folder = directory / f"member-{index}"
        member_config, user = pbt_settings.member(config, user_file, index, own, str(folder))
        members.append(Member(index, Run(member_config, user, folder), own))
    population = Population(config, members, directory, rng, (rules, explore))
    for member in members:
        start = {"round": 0, "seconds": 0.0, "member": member.name, "copied_from": None}
        population.record({**start, "settings": member.settings})
    return config, population, target


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        config, population, target = setup(argv)
    except ValueError as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2
    stop, signals = stop_on_signals()
    started = time.monotonic()
    outcome, code = "", 1
    try:
        for member in population.members:  # every member's processes at once
            member.launch()
        print(
            f"{PROG}: {config.env}, {config.population} members, every {config.interval:g} s,"
            f" folder {population.directory}",
            flush=True,
        )
        outcome, code = watch(population, config, target, stop, started)
    except RuntimeError as err:
        outcome = f"not solved: {err}"
    finally:
        stop_all(population.members)
        for member in population.members:
            member.close()
        population.lineage.close()
        draw(population.directory, target)
    if signals and not outcome:
        outcome, code = "not solved: interrupted", 0 if signals[0] == signal.SIGTERM else 130
    print(outcome, flush=True)
    return code


def watch(population: Population, config: PbtConfig, target, stop, started) -> tuple[str, int]:
    """Rows, rounds and progress lines until solved, out of budget or stopped."""
    last_print = 0.0
    while not stop.wait(config.progress_interval):
        seconds = time.monotonic() - started
        solved = population.step(seconds, target, stop)
        if solved:
            return solved, 0
        steps = population.env_steps()
        if seconds - last_print >= 5:
            scores = "  ".join(f"{m.name} {m.score:.1f}" for m in population.members)
            print(f"{seconds:6.1f} s  env steps {steps:,.0f}  eval {scores}", flush=True)
            last_print = seconds
        if seconds > config.max_seconds or (config.max_env_steps and steps > config.max_env_steps):
            bests = [m.rows[-1]["eval_best_mean_return"] for m in population.members if m.rows]
            best = max((b for b in bests if not math.isnan(b)), default=math.nan)
            return f"not solved in {seconds:.1f} s: best model {best:.1f} < {target:g}", 1
    return "", 1


def draw(directory: Path, target: float) -> None:
    from apexrl import plot

    try:
        plot.population_curves(directory, target)
    except (ImportError, ValueError) as err:
        log.info("population.png not drawn: %s", err)
