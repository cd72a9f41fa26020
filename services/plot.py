"""Learning curves of local-mode runs, drawn with matplotlib when it is installed (the `local`
extra): a run's learning_curve.png (without matplotlib the run still finishes, and the PNG is
skipped with one line), and `apexrl plot RUN [RUN ...]`, runs overlaid in one PNG."""

import argparse
import csv
import logging
import math
import sys
import tomllib
from pathlib import Path

log = logging.getLogger(__name__)

# The two views of a curve: the metrics.csv column on x, and its axis label.
VIEWS = (("seconds", "wall seconds"), ("env_steps", "env steps"))


def figure(runs: list[tuple[str, list[dict]]], target: float | None):
    """Evaluation return against wall seconds (left) and env steps (right): a line per
    (label, metrics.csv rows) run, over its evaluated rows, and the target (None: no line)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, (x, label) in zip(axes, VIEWS, strict=True):
        for name, rows in runs:
            evaluated = [r for r in rows if r["eval_rounds"] > 0]
            ax.plot(
                [r[x] for r in evaluated], [r["eval_mean_return"] for r in evaluated], label=name
            )
        if target is not None:
            ax.axhline(target, color="gray", linestyle="--", label=f"target {target:g}")
        ax.set_xlabel(label)
        ax.set_ylabel("return")
        ax.legend(loc="lower right")
    fig.tight_layout()
    return fig


def save(fig, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=100)
    plt.close(fig)


def learning_curve(rows: list[dict], path: Path, target: float) -> bool:
    """A run's evaluation mean against wall seconds and env steps, with the target; False
    (and one log line) when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        log.info("matplotlib is not installed: %s not drawn (pip install matplotlib)", path.name)
        return False
    save(figure([("evaluation mean", rows)], target), path)
    return True


def read_run(folder: Path) -> list[dict]:
    """A run folder's metrics.csv rows, every column a float; ValueError naming the folder
    when it has none."""
    path = folder / "metrics.csv"
    try:
        with open(path, newline="") as fh:
            return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(fh)]
    except FileNotFoundError as err:
        raise ValueError(f"{folder}: no metrics.csv (not a local-mode run folder?)") from err
    except (OSError, ValueError) as err:
        raise ValueError(f"{path}: unreadable ({err})") from err


def run_env(folder: Path) -> str | None:
    """The env a run trained on, from its config.toml (None without one)."""
    try:
        return tomllib.loads((folder / "config.toml").read_text()).get("env")
    except (OSError, tomllib.TOMLDecodeError):
        return None


def main(argv: list[str]) -> int:
    """apexrl plot RUN [RUN ...]: the runs' evaluation curves overlaid in one PNG."""
    parser = argparse.ArgumentParser(
        prog="apexrl plot",
        description="Overlays local-mode runs' evaluation curves (return against wall seconds"
        " and against env steps) in one PNG.",
    )
    parser.add_argument("runs", nargs="+", type=Path, help="run folders (each with metrics.csv)")
    parser.add_argument("--output", default="runs.png", help="the PNG to write")
    parser.add_argument(
        "--target-return",
        type=float,
        default=math.nan,
        help="the target line; nan (the default): the runs' env's threshold, as local mode's",
    )
    args = parser.parse_args(argv)
    try:
        runs = [(str(folder), read_run(folder)) for folder in args.runs]
        import matplotlib  # noqa: F401
    except ValueError as err:
        return _refuse(err)
    except ImportError:
        return _refuse("matplotlib is not installed (pip install apexrl[local])")
    target = args.target_return
    if math.isnan(target):
        target = default_target(args.runs)
    try:
        save(figure(runs, target), Path(args.output))
    except OSError as err:
        return _refuse(f"--output {args.output}: cannot write ({err.strerror or err})")
    print(f"{args.output}: {len(runs)} runs")
    return 0


def default_target(folders: list[Path]) -> float | None:
    """The target of the runs' env, by local mode's rule; None for runs of several envs (or
    without a config.toml)."""
    envs = {run_env(folder) for folder in folders}
    if len(envs) != 1 or None in envs:
        return None
    import gymnasium

    from apexrl import local

    try:
        return local.default_target(envs.pop())
    except gymnasium.error.Error:  # an env this machine does not know: no line
        return None


def _refuse(message) -> int:
    print(f"apexrl plot: error: {message}", file=sys.stderr)
    return 2
