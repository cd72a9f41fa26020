"""`apexrl local`: the run folder, the children, the progress rows and the outputs (metrics.csv,
learning_curve.png, the best model's line)."""

import logging
import math
import os
import sys
import time
import tomllib
from pathlib import Path

from apexrl import plot
from apexrl.algorithms.envs import default_target
from apexrl.common.tensorboard import Scalars
from apexrl.local.monitoring import monitor
from apexrl.local.settings import parse
from apexrl.local.supervision import Run, stop_on_signals


def main(argv: list[str]) -> int:
    try:
        config = parse(argv)
    except ValueError as err:  # a setting that can never work: say which, before any process
        print(f"apexrl local: error: {err}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    user_file: dict = {}
    config_file = os.environ.get("APEXRL_CONFIG", "")
    if "--config" in argv:
        config_file = argv[argv.index("--config") + 1]
    if config_file:
        with open(config_file, "rb") as fh:
            user_file = tomllib.load(fh)
    target = (
        default_target(config.env) if math.isnan(config.target_return) else config.target_return
    )
    if target is None:
        sys.exit(f"apexrl local: {config.env} has no reward_threshold: pass --target-return")
    run_dir = Path(config.run_dir or f"runs/{config.env}-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        run = Run(config, user_file, run_dir)
        scalars = (
            Scalars(str(Path(config.tensorboard) / run_dir.name)) if config.tensorboard else None
        )
    except ValueError as err:  # settings that can never work: say which, before any process
        print(f"apexrl local: error: {err}", file=sys.stderr)
        return 2

    stop, interrupted = stop_on_signals()

    rows: list[dict] = []
    outcome, code = "", 1
    started = time.monotonic()
    try:
        run.start_all()
        run.start_evaluator()
        print(
            f"apexrl local: {config.env}, {config.actors} actors, run folder {run_dir}", flush=True
        )
        outcome, code = monitor(run, config, target, rows, stop, started, scalars)
    except RuntimeError as err:
        outcome = f"not solved: {err}"
    finally:
        if interrupted and not outcome:
            outcome, code = "not solved: interrupted", 130
        run.stop_all()
        _write_outputs(run_dir, rows, target)
        if scalars is not None:
            scalars.close()
    if code == 0:
        outcome += "; " + best_model(run.checkpoint_dir)
    print(("\n" if sys.stdout.isatty() else "") + outcome, flush=True)
    return code


def best_model(checkpoint_dir: Path) -> str:
    """What the learner kept as the best model: the parameters that earned "solved"."""
    from apexrl.common import checkpoint
    from apexrl.learner.best import KIND as BEST

    found = checkpoint.load_newest(checkpoint_dir, BEST)
    if found is None:
        return f"no best model in {checkpoint_dir}"
    path, meta, _ = found
    return (
        f"best model: version {meta['version']} (update {meta['update_step']}), mean return"
        f" {meta['mean_return']:.1f} over {meta['protocol']['episodes']} episodes, in {path}"
        f" (play it: apexrl eval --checkpoint {checkpoint_dir})"
    )


def _write_outputs(run_dir: Path, rows: list[dict], target: float) -> None:
    if rows:
        plot.learning_curve(run_dir, rows, target)
