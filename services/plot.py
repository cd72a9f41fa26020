"""Learning curves of local-mode runs, drawn with matplotlib when it is installed (the `local`
extra): a run's learning_curve.png (without matplotlib the run still finishes, and the PNG is
skipped with one line), and `apexrl plot RUN [RUN ...]`, runs overlaid in one PNG.

Each run is its best model's score (a step at each new best: what "solved" and the saved
checkpoint mean) as a solid line, its evaluations as points and, where metrics.csv has the
column, the actors' mean episode return as a faint line; against wall time (left) and env steps
(right, with Atari frames on the top axis). The legend sits under the plots, outside the data."""

import argparse
import csv
import json
import logging
import math
import sys
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

# An `apexrl pbt` folder's lineage: each member's start, then every exploit step.
LINEAGE = "lineage.jsonl"
# Runs longer than this are drawn against minutes rather than seconds.
MINUTES_AFTER_SECONDS = 600.0
# The actors' mean undiscounted return over the episodes they finished since the previous row.
ACTOR_RETURN = "actor_mean_return"
# A target this many times the scores' range away from them (a run kept going on purpose, with an
# unreachable --target-return) would flatten the curves: it is named in the title instead.
TARGET_OFF_SCALE_SPANS = 10.0

# What each run draws, each in the run's colour: (label, metrics.csv column, line style).
BEST, EVALUATIONS, ACTORS = "best model", "evaluations", "actors' episodes (mean)"
CURVES = (
    (BEST, "eval_best_mean_return", {"linewidth": 2, "drawstyle": "steps-post", "zorder": 3}),
    (
        EVALUATIONS,
        "eval_mean_return",
        {"linestyle": "none", "marker": "o", "markersize": 3, "alpha": 0.6, "zorder": 2.5},
    ),
    (ACTORS, ACTOR_RETURN, {"linewidth": 0.8, "alpha": 0.3, "zorder": 1.5}),
)


@dataclass
class Run:
    """A run's metrics.csv rows, every column a float, and its settings from config.toml."""

    name: str
    rows: list[dict]
    env: str | None = None
    algorithm: str | None = None
    seed: int | None = None

    @property
    def atari(self) -> bool:
        return self.env is not None and self.env.startswith("ALE/")

    def describe(self) -> str:
        """The run in words, e.g. "dqn on ALE/Pong-v5, seed 1" (its folder without config.toml)."""
        parts = [" on ".join(part for part in (self.algorithm, self.env) if part)]
        if self.seed is not None:
            parts.append(f"seed {self.seed}" if self.seed else "seed from the OS")
        return ", ".join(part for part in parts if part) or self.name


def count_label(value: float, _pos=None) -> str:
    """A count as people write it: 500, 100K, 1.5M, 2B."""
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(value) >= scale:
            return f"{round(value / scale, 3):g}{suffix}"
    return f"{round(value, 3):g}"


def figure(
    runs: list[Run],
    target: float | None,
    target_source: str = "given",
    marks: Sequence[tuple[float, int, str]] = (),
):
    """Each run's best model, evaluations and actors' returns against wall time (left) and env
    steps (right); the target as a dashed line (None: no line), `target_source` saying where it
    comes from ("given", "CartPole-v1's threshold"); `marks`: (seconds, run index, label) as
    a dotted line in that run's colour on the wall-time plot (a population's exploit steps)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    fig, (wall, steps) = plt.subplots(1, 2, figsize=(11, 4.8), layout="constrained")
    minutes = max(r["seconds"] for run in runs for r in run.rows) > MINUTES_AFTER_SECONDS
    several = len(runs) > 1
    scores: list[float] = []
    for index, run in enumerate(runs):
        prefix = f"{run_label(run)}: " if several else ""
        for label, column, style in CURVES:
            rows = _new_evaluations(run.rows) if label == EVALUATIONS else run.rows
            rows = [r for r in rows if not math.isnan(r.get(column, math.nan))]
            if not rows:
                continue
            scores += [r[column] for r in rows]
            for ax, x in ((wall, "seconds"), (steps, "env_steps")):
                scale = 60 if minutes and x == "seconds" else 1
                ax.plot(
                    [r[x] / scale for r in rows],
                    [r[column] for r in rows],
                    color=f"C{index}",
                    label=prefix + label,
                    **style,
                )

    _mark(wall, marks, 60 if minutes else 1)
    off_scale = target is not None and _off_scale(target, scores)
    for ax in (wall, steps):
        if target is not None and not off_scale:
            ax.axhline(
                target, color="gray", linestyle="--", label=f"target {target:g} ({target_source})"
            )
        ax.set_ylabel("episode return")
        ax.grid(alpha=0.3)
    wall.set_xlabel("wall minutes" if minutes else "wall seconds")
    steps.xaxis.set_major_formatter(FuncFormatter(count_label))
    if all(run.atari for run in runs):
        # Imported here: envs imports gymnasium and numpy, which importing plot does without.
        from apexrl.algorithms.envs import FRAME_SKIP

        steps.set_xlabel("env steps (agent steps)")
        frames = steps.secondary_xaxis(
            "top", functions=(lambda s: s * FRAME_SKIP, lambda f: f / FRAME_SKIP)
        )
        frames.xaxis.set_major_formatter(FuncFormatter(count_label))
        frames.set_xlabel(f"env frames (env steps x frame skip {FRAME_SKIP})")
    else:
        steps.set_xlabel("env steps")

    title = _several_title(runs) if several else runs[0].describe()
    if off_scale:
        title += f"; target {target:g} ({target_source}) far off the scores, not drawn"
    fig.suptitle(title)
    handles, labels = steps.get_legend_handles_labels()
    if several:
        handles, labels = _legend_of_several(handles, labels)
    fig.legend(handles, labels, loc="outside lower center", ncols=min(len(handles), 4))
    return fig


def _legend_of_several(handles: list, labels: list[str]) -> tuple[list, list[str]]:
    """A colour per run (its best model), then each curve's style once, in gray."""
    from matplotlib.lines import Line2D

    lines = list(zip(handles, labels, strict=True))
    bests = [(h, lab) for h, lab in lines if lab.endswith(": " + BEST)]
    handles = [h for h, _ in bests]
    labels = [lab.removesuffix(": " + BEST) for _, lab in bests]
    for label, _, style in CURVES:
        if any(lab.endswith(": " + label) for _, lab in lines):
            handles.append(Line2D([], [], color="gray", **style))
            labels.append(label)
    handles += [h for h, lab in lines if lab.startswith("target")]
    labels += [lab for _, lab in lines if lab.startswith("target")]
    return handles, labels


def _mark(ax, marks: Sequence[tuple[float, int, str]], scale: float) -> None:
    """Each (seconds, run index, label) as a dotted line in the run's colour, labelled."""
    for seconds, index, text in marks:
        at = seconds / scale
        ax.axvline(at, color=f"C{index}", linestyle=":", linewidth=1)
        ax.annotate(
            text,
            (at, 0.02),
            xycoords=("data", "axes fraction"),
            rotation=90,
            fontsize=7,
            color=f"C{index}",
        )


def run_label(run: Run) -> str:
    """A run in a legend of several: its folder, with the algorithm and seed it used."""
    details = ", ".join(
        part for part in (run.algorithm, None if run.seed is None else f"seed {run.seed}") if part
    )
    return f"{run.name} ({details})" if details else run.name


def _new_evaluations(rows: list[dict]) -> list[dict]:
    """The rows that report an evaluation round not seen in the row before (each round once)."""
    rounds = [0.0] + [r["eval_rounds"] for r in rows]
    return [r for r, before in zip(rows, rounds, strict=False) if r["eval_rounds"] > before]


def _off_scale(target: float, scores: list[float]) -> bool:
    finite = [s for s in scores if not math.isnan(s)]
    if not finite:
        return False
    low, high = min(finite), max(finite)
    span = max(high - low, 1.0)
    return not low - TARGET_OFF_SCALE_SPANS * span <= target <= high + TARGET_OFF_SCALE_SPANS * span


def _several_title(runs: list[Run]) -> str:
    envs = {run.env for run in runs}
    where = f" on {next(iter(envs))}" if len(envs) == 1 and None not in envs else ""
    return f"{len(runs)} runs{where}"


def save(fig, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=100)
    plt.close(fig)


def learning_curve(run_dir: Path, rows: list[dict], target: float) -> bool:
    """A run's learning_curve.png in `run_dir`, from its rows so far and the target local mode
    stops at; False (and one log line) when matplotlib is missing."""
    path = run_dir / "learning_curve.png"
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        log.info("matplotlib is not installed: %s not drawn (pip install matplotlib)", path.name)
        return False
    run = Run(run_dir.name, rows, *_settings(run_dir))
    save(figure([run], target, target_source(target, run.env)), path)
    return True


def target_source(target: float, env: str | None) -> str:
    """Where a target comes from: the env's threshold when it is that, else given."""
    if env is not None and target == default_target_of(env):
        return f"{env}'s threshold"
    return "given"


def read_run(folder: Path) -> Run:
    """A run folder's metrics.csv rows, every column a float, and its settings; ValueError
    naming the folder when it has no metrics.csv."""
    path = folder / "metrics.csv"
    try:
        with open(path, newline="") as fh:
            rows = [{k: float(v) for k, v in row.items()} for row in csv.DictReader(fh)]
    except FileNotFoundError as err:
        raise ValueError(f"{folder}: no metrics.csv (not a local-mode run folder?)") from err
    except (OSError, ValueError) as err:
        raise ValueError(f"{path}: unreadable ({err})") from err
    if not rows:
        raise ValueError(f"{path}: no rows")
    return Run(str(folder), rows, *_settings(folder))


def read_population(folder: Path, first: int = 0) -> tuple[list[Run], list[tuple[float, int, str]]]:
    """An `apexrl pbt` folder's members, each a run, and its exploit steps as figure() marks
    (run indices from `first`); ValueError naming the folder when a member cannot be read."""
    path = folder / LINEAGE
    try:
        entries = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, ValueError) as err:
        raise ValueError(f"{path}: unreadable ({err})") from err
    names = [e["member"] for e in entries if e["copied_from"] is None]
    runs = [read_run(folder / name) for name in names]
    for run, name in zip(runs, names, strict=True):
        run.name = f"{folder.name}/{name}"
    marks = [
        (e["seconds"], first + names.index(e["member"]), f"{e['member']} from {e['copied_from']}")
        for e in entries
        if e["copied_from"] is not None
    ]
    return runs, marks


def population_curves(folder: Path, target: float) -> Path:
    """The members' curves with the exploit steps marked, as `folder`/population.png;
    ImportError without matplotlib, ValueError for a folder it cannot read."""
    import matplotlib  # noqa: F401

    runs, marks = read_population(folder)
    path = folder / "population.png"
    save(figure(runs, target, target_source(target, runs[0].env), marks), path)
    return path


def _settings(folder: Path) -> tuple[str | None, str | None, int | None]:
    """The env, algorithm and seed a run used, from its config.toml (None where it has none)."""
    try:
        settings = tomllib.loads((folder / "config.toml").read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return None, None, None
    return settings.get("env"), settings.get("algorithm"), settings.get("seed")


def main(argv: list[str]) -> int:
    """apexrl plot RUN [RUN ...]: the runs' learning curves overlaid in one PNG."""
    parser = argparse.ArgumentParser(
        prog="apexrl plot",
        description="Overlays local-mode runs' learning curves (each run's best model, its"
        " evaluations and its actors' returns, against wall time and env steps) in one PNG.",
    )
    parser.add_argument(
        "runs",
        nargs="+",
        type=Path,
        help="run folders (each with metrics.csv), or `apexrl pbt` folders (every member, each"
        " exploit step marked)",
    )
    parser.add_argument("--output", default="runs.png", help="the PNG to write")
    parser.add_argument(
        "--target-return",
        type=float,
        default=math.nan,
        help="the target line; nan (the default): the runs' env's threshold, as local mode's",
    )
    args = parser.parse_args(argv)
    try:
        runs: list[Run] = []
        marks: list[tuple[float, int, str]] = []
        for folder in args.runs:
            if (folder / LINEAGE).exists():  # a population: its members, exploits marked
                members, steps = read_population(folder, len(runs))
                runs, marks = runs + members, marks + steps
            else:
                runs.append(read_run(folder))
        import matplotlib  # noqa: F401
    except ValueError as err:
        return _refuse(err)
    except ImportError:
        return _refuse("matplotlib is not installed (pip install apexrl[local])")
    target, source = args.target_return, "given"
    if math.isnan(target):
        target = default_target(runs)
        source = f"{runs[0].env}'s threshold"
    try:
        save(figure(runs, target, source, marks), Path(args.output))
    except OSError as err:
        return _refuse(f"--output {args.output}: cannot write ({err.strerror or err})")
    print(f"{args.output}: {len(runs)} runs")
    return 0


def default_target(runs: list[Run]) -> float | None:
    """The target of the runs' env, by local mode's rule; None for runs of several envs (or
    without a config.toml)."""
    envs = {run.env for run in runs}
    env = envs.pop() if len(envs) == 1 else None
    return None if env is None else default_target_of(env)


def default_target_of(env: str) -> float | None:
    """Local mode's target for `env`; None for an env this machine does not know."""
    import gymnasium

    from apexrl.algorithms.envs import default_target

    try:
        return default_target(env)
    except gymnasium.error.Error:
        return None


def _refuse(message) -> int:
    print(f"apexrl plot: error: {message}", file=sys.stderr)
    return 2
