"""The settings of the commands a person runs beside the services: `apexrl local` (a whole run
on one machine), `apexrl pbt` (a population of them), `apexrl eval` (plays a checkpoint) and
`apexrl set` (changes a running learner's settings). None is a process of a deployment (those
are config.py's, each a ProcessConfig); each is read from defaults, file, environment and flags
as config.py documents.
"""

import math
from dataclasses import dataclass, field

from apexrl.config import AgentConfig, ClientTLSConfig, option


@dataclass
class LocalConfig(AgentConfig):
    """apexrl local: replay, learner, actors and an evaluator as processes on loopback."""

    actors: int = option(2, "actor processes")
    replay_shards: int = option(
        1,
        "replay processes (shards); the [replay] capacity, min_size_to_sample and error_buffer "
        "are split evenly over them, so the totals stay as set",
    )
    run_dir: str = option(
        "",
        "run folder for config, logs, metrics CSV, plot, checkpoints (default runs/<env>-<time>)",
    )
    max_seconds: float = option(300.0, "give up after this many seconds")
    max_env_steps: int = option(0, "give up after this many env steps (0: no limit)")
    target_return: float = option(
        math.nan,
        "the best model's score (mean evaluation return) that counts as solved; nan (the"
        " default): the env's threshold (gymnasium's reward_threshold, or envs.TARGETS)",
    )
    progress_interval: float = option(0.5, "seconds between progress updates and metrics CSV rows")
    video_every: int = option(
        0,
        "the evaluator records one episode of the 1st, (K+1)-th, ... new best model as mp4 in"
        " RUN_DIR/videos (0: none; needs the video extra)",
    )
    tensorboard: str = option(
        "",
        "also write metrics.csv's columns as TensorBoard scalars (step: env steps) to"
        " DIR/<run folder name>, so `tensorboard --logdir DIR` overlays runs (needs the"
        " tensorboard extra)",
    )
    log_level: str = option("INFO", "logging level of the services (their logs go to RUN_DIR/logs)")
    learner_cpu: int = option(
        -1,
        "pin the learner to this CPU and every other service to the remaining ones (Linux"
        " sched_setaffinity; -1: no pinning): its one training thread then has a core to itself",
    )


@dataclass
class PbtConfig(LocalConfig):
    """apexrl pbt: a population of local-mode runs trained by population-based training; at
    each interval the worst go on from the best's newest checkpoint with perturbed settings
    (docs/pbt.md). Top-level settings and [pbt] apply; every member shares them."""

    population: int = option(4, "members (local-mode runs sharing this machine), at least 2")
    interval: float = option(30.0, "seconds between exploit/explore rounds (> 0)")
    fraction: float = option(
        0.25, "truncation selection: the bottom this fraction copies a member of the top as much"
    )
    perturb: str = option(
        "0.8,1.2", "explore: factors a copied setting is multiplied by, one drawn each (each > 0)"
    )
    resample_probability: float = option(
        0.1, "explore: probability a copied setting is drawn afresh from its initial distribution"
    )
    explore: list = field(
        default_factory=list,
        metadata={
            "help": "the settings PBT moves ([[pbt.explore]] entries: setting = NAME and one of"
            " log_uniform = [LOW, HIGH], uniform = [LOW, HIGH], values = [one per member]);"
            " none: learning_rate log-uniform over [1e-5, 1e-1]",
            "file_only": True,
        },
    )


@dataclass
class EvalConfig:
    """apexrl eval: plays a learner checkpoint greedily and prints the returns."""

    checkpoint: str = option(
        "",
        "checkpoint file, or a learner's checkpoint directory: its best model (the parameters"
        " the evaluator scored highest), else its newest checkpoint",
    )
    latest: bool = option(False, "in a directory, play the newest checkpoint, not the best model")
    episodes: int = option(10, "episodes to play")
    seed: int = option(
        1_000_000,
        "seed of the first episode (episode k: seed + k); the evaluator counts up from the run's"
        " seed, so the default plays episodes it never saw",
    )
    epsilon: float = option(0.0, "exploration (0: greedy)")
    video: str = option(
        "",
        "record each episode as mp4 in this folder, named by env, version, seed and return"
        " (played one at a time; needs the video extra)",
    )
    record: str = option(
        "",
        "write each episode (observations, actions, the env's rewards) as .npz in this folder,"
        " with an index.json: demonstrations (docs/demonstrations.md; played one at a time)",
    )


@dataclass
class SetConfig(ClientTLSConfig):
    """apexrl set NAME=VALUE ...: changes settings of a running learner, from its next update
    on (those a schedule could move: docs/algorithms.md#schedules)."""

    learner: str = option("127.0.0.1:50052", "learner server address")
    timeout: float = option(10.0, "seconds to wait for the learner's answer to each change")
