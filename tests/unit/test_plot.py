"""`apexrl plot RUN [RUN ...]`: runs' evaluation curves overlaid in one PNG."""

import csv
import math

import matplotlib.image
import pytest

from apexrl import cli, plot
from apexrl.local import FIELDS

# Two tiny runs: (seconds, env steps, evaluations so far, mean return); NaN: no evaluation yet.
RUNS = {
    "fast": [(0.5, 0, 0, math.nan), (1.0, 900, 1, 20.0), (1.5, 2_000, 2, 180.0), (2.0, 3_100, 3, 480.0)],
    "slow": [(0.5, 0, 0, math.nan), (1.0, 500, 1, 9.5), (1.5, 1_000, 2, 60.0)],
}  # fmt: skip


def write_run(folder, rows, env="CartPole-v1"):
    folder.mkdir()
    with open(folder / "metrics.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, FIELDS)
        writer.writeheader()
        for seconds, steps, rounds, mean in rows:
            row = dict.fromkeys(FIELDS, 0.0)
            row.update(seconds=seconds, env_steps=steps, eval_rounds=rounds, eval_mean_return=mean)
            writer.writerow(row)
    (folder / "config.toml").write_text(f'env = "{env}"\n')
    return folder


def plot_command(*argv) -> int:
    with pytest.raises(SystemExit) as exited:
        cli.main(["plot", *map(str, argv)])
    return exited.value.code


def test_two_runs_are_two_lines_with_their_values_and_the_envs_target(tmp_path):
    folders = [write_run(tmp_path / name, rows) for name, rows in RUNS.items()]
    output = tmp_path / "both.png"
    assert plot_command(*folders, "--output", output) == 0
    height, width, _ = matplotlib.image.imread(output).shape
    assert (width, height) == (1100, 400)

    fig = plot.figure([(str(f), plot.read_run(f)) for f in folders], plot.default_target(folders))
    for ax, column in zip(fig.axes, (0, 1), strict=True):  # wall seconds, then env steps
        *runs, target = ax.get_lines()
        assert [line.get_label() for line in runs] == [str(f) for f in folders]
        for line, rows in zip(runs, RUNS.values(), strict=True):
            evaluated = [r for r in rows if r[2] > 0]
            assert list(line.get_xdata()) == [r[column] for r in evaluated]
            assert list(line.get_ydata()) == [r[3] for r in evaluated]
        assert set(target.get_ydata()) == {475.0}  # CartPole-v1's threshold


def test_a_target_given_wins_and_runs_of_two_envs_draw_none(tmp_path):
    one = write_run(tmp_path / "one", RUNS["fast"])
    other = write_run(tmp_path / "other", RUNS["slow"], env="Acrobot-v1")
    assert plot.default_target([one, other]) is None
    fig = plot.figure([("one", plot.read_run(one))], plot.default_target([one]))
    assert len(fig.axes[0].get_lines()) == 2
    fig = plot.figure([("one", plot.read_run(one)), ("other", plot.read_run(other))], None)
    assert len(fig.axes[0].get_lines()) == 2  # the runs, no target
    output = tmp_path / "given.png"
    assert plot_command(one, other, "--target-return", "-100", "--output", output) == 0
    assert output.stat().st_size > 0


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
