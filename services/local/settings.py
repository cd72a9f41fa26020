"""Local mode's settings: the command line over the algorithm's presets for the env, and the
one TOML file every child process reads (as a ConfigMap would)."""

import dataclasses
import math
from pathlib import Path
from typing import Any, TypeVar

import tomli_w

from apexrl import config as cfg
from apexrl.algorithms.envs import EnvOptions, is_atari
from apexrl.command_config import LocalConfig
from apexrl.draws import Draw
from apexrl.replay_tables import entry as table_entry
from apexrl.schedules import Schedule

L = TypeVar("L", bound=LocalConfig)

# Settings local mode gives each service, under the algorithm's presets for the env and the
# user's --config file.
SERVICE_DEFAULTS: dict[str, dict[str, Any]] = {
    "replay": {},
    "learner": {"checkpoint_interval": 0.0},
    "actor": {},
    "evaluator": {},
}
# On top of those for Atari (ALE/... ids), whatever the algorithm: 4 envs an actor, short
# evaluations (a Pong episode is 800+ agent steps), and the evaluator held to a tenth of a core
# (of the two a small machine has), so that the learner gets the CPU.
ATARI_DEFAULTS: dict[str, dict[str, Any]] = {
    "actor": {"num_envs": 4},
    "evaluator": {
        "episodes": 2,
        "confirm_episodes": 4,
        "interval": 30.0,
        "window": 0,
        "cpu_share": 0.1,
    },
}

# A table's settings: local mode takes the tables from the algorithm's builder.
TABLE_SETTINGS = {f.name for f in dataclasses.fields(cfg.ReplayTableConfig)} | {"table", "tables"}


def parse(argv: list[str]) -> LocalConfig:
    """Local mode's settings; the algorithm's own ones over its presets for the env."""
    return parse_as(LocalConfig, argv, "local")


def parse_as(cls: type[L], argv: list[str], section: str) -> L:
    """The settings of local mode or of a command built on it (as `apexrl pbt`), from its
    [section] table."""
    from apexrl import algorithms

    prog = f"apexrl {section}"
    config = cfg.parse(cls, argv, section, prog, algorithms.REGISTRY)
    builder = algorithms.get(config.algorithm)
    presets = builder.presets(config.env)
    if presets.get(builder.name):
        defaults = {builder.name: presets[builder.name]}
        config = cfg.parse(cls, argv, section, prog, algorithms.REGISTRY, defaults)
    return config


def signature(config: cfg.AgentConfig) -> str:
    """The replay `signature` setting for the algorithm's items on the env (torch-free: the
    parent process of local mode never imports torch)."""
    from apexrl import algorithms

    return ",".join(column.spec() for column in algorithms.transition_columns(config))


def replay_tables(config: cfg.AgentConfig, shards: int) -> list[dict]:
    """The algorithm's tables as [[replay.tables]] entries, each shard's even share of their
    sizes (so the totals stay as set)."""
    from apexrl import algorithms

    if shards < 1:
        raise ValueError(f"replay_shards: must be >= 1, got {shards}")
    tables = []
    for table in algorithms.make(config).tables():
        entry = table_entry(table)
        entry["capacity"] = math.ceil(table.capacity / shards)
        if table.rate_limiter == "ratio":
            entry["min_size_to_sample"] = math.ceil(table.min_size_to_sample / shards)
            entry["error_buffer"] = table.error_buffer / shards
        tables.append(entry)
    return tables


def dump_toml(data: dict) -> str:
    """A config as TOML text (a schedule or a per-actor distribution as its table: schedules.py,
    draws.py)."""

    def plain(value):
        if isinstance(value, Schedule | Draw):
            return value.table()
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, list):
            return [plain(v) for v in value]
        return value

    return tomli_w.dumps(plain(data))


def write_config(config: LocalConfig, user_file: dict, run_dir: Path) -> dict:
    """Every service's settings, as local mode runs them (defaults, the algorithm's presets,
    Atari's, the user's file, the command line), written to run_dir/config.toml."""
    from apexrl import algorithms

    agent = {
        f.name: getattr(config, f.name)
        for f in dataclasses.fields(cfg.AgentConfig)
        if not f.metadata.get("internal")
    }
    # A top-level key holds a number: a shared setting drawn per actor goes to [actor] alone.
    drawn = {name: value for name, value in agent.items() if isinstance(value, Draw)}
    settings = {**{k: v for k, v in agent.items() if k not in drawn}, "log_level": config.log_level}
    builder = algorithms.get(config.algorithm)
    presets = builder.presets(config.env)
    atari = ATARI_DEFAULTS if is_atari(config.env) else {}
    for section, defaults in SERVICE_DEFAULTS.items():
        settings[section] = {
            **defaults,
            **presets.get(section, {}),
            **atari.get(section, {}),
            **user_file.get(section, {}),
        }
    settings["actor"] = {**drawn, **settings["actor"]}
    settings[builder.name] = dataclasses.asdict(config.algo)
    given = sorted(TABLE_SETTINGS & set(user_file.get("replay", {})))
    if given:
        raise ValueError(
            f"[replay] {given[0]}: local mode makes the replay's tables from algorithm"
            f" {builder.name}'s builder; set its sizes in [{builder.name}]"
            f" (`apexrl local --algorithm {builder.name} --help`)"
        )
    settings["replay"]["tables"] = replay_tables(config, config.replay_shards)
    if config.video_every < 0:
        raise ValueError(f"video_every: must be >= 0 (0: no videos), got {config.video_every}")
    if config.video_every:
        from apexrl.algorithms import video

        video.prepare(config.env, EnvOptions.of(config), str(run_dir / "videos"))
        settings["evaluator"]["video_every"] = config.video_every
        settings["evaluator"]["video_dir"] = str(run_dir / "videos")
    check_pretrain(settings["learner"], config)
    settings["learner"].setdefault("checkpoint_dir", str(run_dir / "checkpoints"))
    (run_dir / "config.toml").write_text(dump_toml(settings))
    return settings


def check_pretrain(learner: dict, config: LocalConfig) -> None:
    """The learner's behaviour cloning settings, checked before any process starts: the
    numbers, and the demonstrations against the env (ValueError naming the setting and the
    file, as the learner would)."""
    from apexrl.algorithms import demonstrations
    from apexrl.algorithms.envs import env_spec

    defaults = {f.name: f.default for f in dataclasses.fields(cfg.LearnerConfig)}
    names = ("pretrain_steps", "pretrain_batch_size", "pretrain_learning_rate")
    kinds = (int, int, float)
    values = [
        cfg.convert(learner.get(name, defaults[name]), kind, name)
        for name, kind in zip(names, kinds, strict=True)
    ]
    cfg.check_pretrain(*values)
    if learner.get("pretrain_demonstrations"):
        spec = env_spec(config.env, EnvOptions.of(config))
        demonstrations.pairs(str(learner["pretrain_demonstrations"]), spec)
