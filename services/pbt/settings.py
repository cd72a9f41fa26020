"""The population's settings, checked at start-up (a ValueError naming the setting, before
any folder or process exists), and each member's: the shared ones with its own values of the
settings PBT moves."""

import copy
import dataclasses
import math
import random
from typing import TYPE_CHECKING

from apexrl import config as cfg
from apexrl.command_config import PbtConfig
from apexrl.pbt.controller import Explore, Rules, check_rules

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

# The settings PBT moves when [[pbt.explore]] names none.
DEFAULT_EXPLORE = [{"setting": "learning_rate", "log_uniform": [1e-5, 1e-1]}]


def live_settings(config: PbtConfig) -> dict[str, str]:
    """The settings a learner may change during a run (scheduled.py's: those a schedule can
    move), each with the config file table that holds it ("learner" or the algorithm's)."""
    from apexrl import algorithms

    algorithm = algorithms.get(config.algorithm)
    owners: dict[str, type[DataclassInstance]] = {
        "learner": cfg.LearnerConfig,
        algorithm.name: algorithm.Settings,
    }
    return {
        f.name: table
        for table, cls in owners.items()
        for f in dataclasses.fields(cls)
        if f.metadata.get("schedule") == "updates"
    }


def check(config: PbtConfig) -> tuple[Rules, list[Explore]]:
    """The selection rules and the settings explored; ValueError naming the setting."""
    if config.population < 2:
        raise ValueError(
            f"population: must be >= 2 (a population of one has no one to copy), got {config.population}"
        )
    if not (math.isfinite(config.interval) and config.interval > 0):
        raise ValueError(f"interval: must be > 0 seconds, got {config.interval:g}")
    rules = Rules(config.fraction, factors(config.perturb), config.resample_probability)
    check_rules(rules)
    explore = [Explore.of(entry, config.population) for entry in config.explore or DEFAULT_EXPLORE]
    live = live_settings(config)
    for item in explore:
        if item.setting not in live:
            raise ValueError(
                f"explore {item.setting}: cannot change during a run (settings that can:"
                f" {', '.join(live)})"
            )
    names = [item.setting for item in explore]
    if len(set(names)) != len(names):
        raise ValueError(f"explore: a setting named twice in {names}")
    return rules, explore


def factors(text: str) -> tuple[float, ...]:
    """`perturb`'s factors from "0.8,1.2" (a TOML array of numbers reads the same)."""
    words = [w.strip() for w in text.strip().strip("[]").split(",") if w.strip()]
    try:
        return tuple(float(w) for w in words)
    except ValueError:
        raise ValueError(f"perturb: needs numbers separated by commas, got {text!r}") from None


def initial_settings(
    explore: list[Explore], population: int, rng: random.Random
) -> list[dict[str, float]]:
    """Each member's first values of the explored settings."""
    return [{e.setting: e.initial(i, rng) for e in explore} for i in range(population)]


def member(
    config: PbtConfig, user_file: dict, index: int, settings: dict[str, float], run_dir: str
) -> tuple[PbtConfig, dict]:
    """Member `index`'s local-mode config and config file contents: the population's, its own
    run folder and seed (seed + index; 0 stays 0: from the OS), its explored settings where
    their owners read them, and members checkpointing every 5 s (the state the worst copy)
    unless [learner] checkpoint_interval says otherwise."""
    live = live_settings(config)
    own_file = copy.deepcopy(user_file)
    own_file.pop("pbt", None)
    learner = own_file.setdefault("learner", {})
    learner.setdefault("checkpoint_interval", 5.0)
    algo = {}
    for name, value in settings.items():
        if live[name] == "learner":
            learner[name] = value
        else:
            algo[name] = value
    own = dataclasses.replace(
        config,
        run_dir=run_dir,
        seed=config.seed + index if config.seed else 0,
        algo=dataclasses.replace(config.algo, **algo),
    )
    return own, own_file
