"""Learning curves: a run's learning_curve.png and `apexrl plot RUN [RUN ...]`, checked on the
drawn artists (labels, data, tick texts, bounding boxes in display coordinates)."""

import csv
import math

import matplotlib.image
import pytest

from apexrl import cli, plot
from apexrl.local.monitoring import FIELDS

# Two tiny runs, a row per progress tick: (seconds, env steps, evaluation rounds so far, latest
# evaluation's mean, best model's score, actors' mean return); NaN: none yet.
NAN = math.nan
RUNS = {
    "fast": [
        (0.5, 0, 0, NAN, NAN, NAN),
        (1.0, 900, 1, 20.0, 20.0, 15.0),
        (1.5, 1_400, 1, 20.0, 20.0, 30.0),
        (2.0, 2_000, 2, 180.0, 180.0, NAN),
        (2.5, 3_100, 3, 120.0, 180.0, 90.0),
        (3.0, 4_000, 4, 480.0, 480.0, 200.0),
    ],
    "slow": [
        (0.5, 0, 0, NAN, NAN, NAN),
        (1.0, 500, 1, 9.5, 9.5, 12.0),
        (1.5, 1_000, 2, 60.0, 60.0, 25.0),
    ],
}
COLUMNS = (
    "seconds",
    "env_steps",
    "eval_rounds",
    "eval_mean_return",
    "eval_best_mean_return",
    plot.ACTOR_RETURN,
)


def write_run(folder, rows, env="CartPole-v1", algorithm="dqn", seed=1):
    folder.mkdir()
    with open(folder / "metrics.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, [*FIELDS, plot.ACTOR_RETURN])
        writer.writeheader()
        for values in rows:
            row = dict.fromkeys(FIELDS, 0.0)
            row.update(zip(COLUMNS, values, strict=True))
            writer.writerow(row)
    (folder / "config.toml").write_text(
        f'env = "{env}"\nalgorithm = "{algorithm}"\nseed = {seed}\n'
    )
    return folder


def scaled(rows, seconds=1.0, steps=1.0):
    """The rows of a longer run: times and env steps multiplied."""
    return [(s * seconds, n * steps, *rest) for s, n, *rest in rows]


def plot_command(*argv) -> int:
    with pytest.raises(SystemExit) as exited:
        cli.main(["plot", *map(str, argv)])
    return exited.value.code


def lines_by_label(ax) -> dict:
    return {line.get_label(): line for line in ax.get_lines()}


def tick_texts(axis) -> list[str]:
    return [label.get_text() for label in axis.get_ticklabels() if label.get_text()]


def test_counts_read_as_thousands_and_millions():
    labels = [plot.count_label(n) for n in (0, 750, 1_000, 100_000, 250_000, 1_000_000, 1.5e6)]
    assert labels == ["0", "750", "1K", "100K", "250K", "1M", "1.5M"]
    assert plot.count_label(600_000.0000001) == "600K"  # tick positions carry float noise
    assert plot.count_label(2.4e9) == "2.4B"


def test_a_run_draws_its_best_model_as_steps_each_evaluation_once_and_the_actors(tmp_path):
    folder = write_run(tmp_path / "run", RUNS["fast"])
    assert plot.learning_curve(folder, plot.read_run(folder).rows, 475.0)
    height, width, _ = matplotlib.image.imread(folder / "learning_curve.png").shape
    assert (width, height) == (1100, 480)

    run = plot.read_run(folder)
    fig = plot.figure([run], 475.0, plot.target_source(475.0, run.env))
    assert fig.get_suptitle() == "dqn on CartPole-v1, seed 1"
    wall, steps = fig.axes[:2]
    assert wall.get_xlabel() == "wall seconds"
    assert steps.get_xlabel() == "env steps"
    for ax, x in ((wall, 0), (steps, 1)):
        lines = lines_by_label(ax)
        target = "target 475 (CartPole-v1's threshold)"
        assert set(lines) == {plot.BEST, plot.EVALUATIONS, plot.ACTORS, target}
        best = lines[plot.BEST]
        assert best.get_drawstyle() == "steps-post"
        assert list(best.get_xdata()) == [r[x] for r in RUNS["fast"][1:]]  # to the run's end
        assert list(best.get_ydata()) == [20.0, 20.0, 180.0, 180.0, 480.0]
        evaluations = lines[plot.EVALUATIONS]
        assert evaluations.get_linestyle() == "None"  # points: one per evaluation round
        assert list(evaluations.get_ydata()) == [20.0, 180.0, 120.0, 480.0]
        assert list(evaluations.get_xdata()) == [RUNS["fast"][i][x] for i in (1, 3, 4, 5)]
        actors = lines[plot.ACTORS]
        assert list(actors.get_ydata()) == [15.0, 30.0, 90.0, 200.0]
        assert actors.get_alpha() < evaluations.get_alpha() < 1
        assert actors.get_linewidth() < best.get_linewidth()
        assert set(lines[target].get_ydata()) == {475.0}


def test_the_legend_and_the_title_cover_no_data(tmp_path):
    folders = [write_run(tmp_path / name, rows) for name, rows in RUNS.items()]
    for runs in ([plot.read_run(folders[0])], [plot.read_run(f) for f in folders]):
        fig = plot.figure(runs, 475.0)
        fig.canvas.draw()
        (legend,) = fig.legends
        legend_box = legend.get_window_extent()
        title_box = fig._suptitle.get_window_extent()
        for ax in fig.axes:
            data_box = ax.get_window_extent()
            assert not legend_box.overlaps(data_box), (legend_box, data_box)
            assert not title_box.overlaps(data_box), (title_box, data_box)


def test_a_long_atari_run_reads_in_minutes_k_and_m_steps_and_frames(tmp_path):
    folder = write_run(
        tmp_path / "pong", scaled(RUNS["fast"], 1_200, 400), env="ALE/Pong-v5", seed=2
    )
    fig = plot.figure([plot.read_run(folder)], None)
    fig.canvas.draw()
    wall, steps = fig.axes[:2]
    assert fig.get_suptitle() == "dqn on ALE/Pong-v5, seed 2"
    assert wall.get_xlabel() == "wall minutes"
    assert max(lines_by_label(wall)[plot.BEST].get_xdata()) == 60.0
    assert not any(line.get_label().startswith("target") for line in wall.get_lines())

    bottom = tick_texts(steps.xaxis)
    assert {"400K", "800K", "1M", "1.2M"} <= set(bottom), bottom
    assert all(len(text) <= 5 for text in bottom), bottom  # no raw 1600000
    (frames,) = steps.child_axes
    assert "frame skip 4" in frames.get_xlabel()
    top = tick_texts(frames.xaxis)
    assert {"2M", "4M", "6M"} <= set(top), top
    assert all(len(text) <= 5 for text in top), top


def test_a_target_far_off_the_scores_is_named_in_the_title_not_drawn(tmp_path):
    folder = write_run(tmp_path / "pong", RUNS["fast"], env="ALE/Pong-v5")
    fig = plot.figure([plot.read_run(folder)], 100_000.0)
    assert not any(line.get_label().startswith("target") for line in fig.axes[0].get_lines())
    assert "target 100000" in fig.get_suptitle()
    assert max(fig.axes[0].get_ylim()) < 1_000


def test_runs_overlaid_a_colour_each_with_their_best_models_in_the_legend(tmp_path):
    folders = [
        write_run(tmp_path / name, rows, seed=i) for i, (name, rows) in enumerate(RUNS.items(), 1)
    ]
    output = tmp_path / "both.png"
    assert plot_command(*folders, "--output", output) == 0
    assert output.stat().st_size > 0

    runs = [plot.read_run(f) for f in folders]
    fig = plot.figure(runs, plot.default_target(runs), "CartPole-v1's threshold")
    assert fig.get_suptitle() == "2 runs on CartPole-v1"
    names = [f"{folders[0]} (dqn, seed 1)", f"{folders[1]} (dqn, seed 2)"]
    for ax in fig.axes[:2]:
        lines = lines_by_label(ax)
        for index, name in enumerate(names):
            colours = {
                lines[f"{name}: {kind}"].get_color()
                for kind in (plot.BEST, plot.EVALUATIONS, plot.ACTORS)
            }
            assert colours == {f"C{index}"}
        assert set(lines["target 475 (CartPole-v1's threshold)"].get_ydata()) == {475.0}
    (legend,) = fig.legends
    texts = [text.get_text() for text in legend.get_texts()]
    target = "target 475 (CartPole-v1's threshold)"
    assert texts == [*names, plot.BEST, plot.EVALUATIONS, plot.ACTORS, target]


def test_a_target_given_wins_and_runs_of_two_envs_draw_none(tmp_path):
    one = write_run(tmp_path / "one", RUNS["fast"])
    other = write_run(tmp_path / "other", RUNS["slow"], env="Acrobot-v1")
    runs = [plot.read_run(one), plot.read_run(other)]
    assert plot.default_target(runs) is None
    fig = plot.figure(runs, None)
    assert not any(line.get_label().startswith("target") for line in fig.axes[0].get_lines())
    output = tmp_path / "given.png"
    assert plot_command(one, other, "--target-return", "-100", "--output", output) == 0
    assert output.stat().st_size > 0
    fig = plot.figure(runs, -100.0)
    assert "target -100 (given)" in lines_by_label(fig.axes[0])


def test_a_folder_without_metrics_csv_is_one_line_exit_2_and_no_png(tmp_path, capsys):
    good = write_run(tmp_path / "good", RUNS["fast"])
    empty = tmp_path / "empty"
    empty.mkdir()
    output = tmp_path / "out.png"
    assert plot_command(good, empty, "--output", output) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"apexrl plot: error: {empty}: no metrics.csv (not a local-mode run folder?)"
    assert not output.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "good"]
