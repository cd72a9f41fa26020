"""PBT's exploit copy: the winner's newest learner checkpoint becomes the loser's newest with
the explored settings over its live changes, and a copy killed at any point leaves the loser
its own state or the whole copy, never a mix. Also each member's settings, the start-up
errors that name a setting, and a population's plot."""

import csv
import itertools
import json
import os
import shutil
import signal

import numpy as np
import pytest

from apexrl import plot
from apexrl.command_config import PbtConfig
from apexrl.common import checkpoint
from apexrl.local.settings import parse_as
from apexrl.pbt import run as pbt_run
from apexrl.pbt import settings as pbt_settings
from apexrl.pbt.members import copy_state

WINNER_META = {
    "update_step": 500,
    "version": 50,
    "samples_consumed": 9,
    "live_settings": {"beta": 0.5},
}
LOSER_META = {"update_step": 300, "version": 30, "samples_consumed": 4, "live_settings": {}}


COLUMNS = ["seconds", "env_steps", "eval_rounds", "eval_mean_return", "eval_best_mean_return"]


def arrays(value: float) -> dict[str, np.ndarray]:
    return {"online/w": np.full((4, 3), value, np.float32), "adam/step": np.array([value])}


@pytest.fixture
def folders(tmp_path):
    winner, loser = tmp_path / "winner", tmp_path / "loser"
    checkpoint.write_checkpoint(winner, "learner", WINNER_META, arrays(2.0))
    checkpoint.write_checkpoint(loser, "learner", LOSER_META, arrays(1.0))
    return winner, loser


def test_the_copy_is_the_winners_state_with_the_explored_settings(folders):
    winner, loser = folders
    copied = copy_state(winner, loser, {"learning_rate": 1e-3}, {"round": 1})
    path, meta, held = checkpoint.load_newest(loser, "learner")
    assert str(path) == copied["path"]
    assert all(np.array_equal(held[k], v) for k, v in arrays(2.0).items())
    assert (meta["update_step"], meta["version"]) == (500, 50)
    assert meta["live_settings"] == {"beta": 0.5, "learning_rate": 1e-3}
    assert meta["pbt"]["round"] == 1 and meta["pbt"]["source"].startswith(str(winner))


def test_no_copy_from_a_winner_without_a_checkpoint(folders, tmp_path):
    _, loser = folders
    assert copy_state(tmp_path / "empty", loser, {"learning_rate": 1e-3}, {}) is None
    assert checkpoint.load_newest(loser, "learner")[1] == LOSER_META


def copy_killed_at(point: int, winner, loser) -> bool:
    """copy_state in a forked child SIGKILLed at crash point `point`; True if it was killed."""
    pid = os.fork()
    if pid == 0:  # the child: no pytest teardown, whatever happens
        try:
            checkpoint._KILL_AT, checkpoint._crash_points = point, itertools.count(1)
            copy_state(winner, loser, {"learning_rate": 1e-3}, {"round": 1})
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    return os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


def test_a_copy_killed_at_any_point_leaves_the_old_state_or_the_whole_copy(folders, tmp_path):
    winner, loser = folders
    outcomes = []
    for point in range(1, 50):
        target = shutil.copytree(loser, tmp_path / f"loser-{point}")
        killed = copy_killed_at(point, winner, target)
        _, meta, held = checkpoint.load_newest(target, "learner")
        if meta["version"] == 30:
            assert meta == LOSER_META and np.array_equal(held["online/w"], arrays(1.0)["online/w"])
            outcomes.append("old")
        else:
            assert meta["live_settings"] == {"beta": 0.5, "learning_rate": 1e-3}
            assert np.array_equal(held["online/w"], arrays(2.0)["online/w"])
            outcomes.append("copy")
        if not killed:
            break
    assert outcomes[0] == "old" and outcomes[-1] == "copy" and len(outcomes) > 3


def test_each_member_gets_its_own_folder_seed_and_explored_values(tmp_path):
    config = parse_as(PbtConfig, ["--seed", "7", "--population", "3"], "pbt")
    _, explore = pbt_settings.check(config)
    own, user = pbt_settings.member(config, {"pbt": {}}, 2, {"learning_rate": 3e-4}, "m2")
    assert (own.run_dir, own.seed) == ("m2", 9)
    assert user == {"learner": {"checkpoint_interval": 5.0, "learning_rate": 3e-4}}
    assert [e.setting for e in explore] == ["learning_rate"]  # the default
    ppo = parse_as(PbtConfig, ["--algorithm", "ppo"], "pbt")
    own, user = pbt_settings.member(ppo, {}, 0, {"entropy_cost": 0.02}, "m0")
    assert own.algo.entropy_cost == 0.02 and "entropy_cost" not in user["learner"]


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--population", "1"], "population: must be >= 2"),
        (["--interval", "0"], "interval: must be > 0"),
        (["--interval", "-3"], "interval: must be > 0"),
        (["--perturb", "0.8,0"], "perturb: each factor must be > 0, got 0"),
        (["--perturb", "fast"], "perturb: needs numbers"),
    ],
)
def test_bad_population_settings_name_the_setting(flags, named):
    with pytest.raises(ValueError, match=named):
        pbt_settings.check(parse_as(PbtConfig, flags, "pbt"))


def test_an_explored_setting_must_be_one_that_changes_during_a_run(tmp_path):
    path = tmp_path / "pbt.toml"
    path.write_text('[[pbt.explore]]\nsetting = "gamma"\nuniform = [0.9, 0.99]\n')
    with pytest.raises(ValueError, match="explore gamma: cannot change during a run"):
        pbt_settings.check(parse_as(PbtConfig, ["--config", str(path)], "pbt"))


def test_a_population_plot_holds_each_member_and_marks_each_exploit(tmp_path):
    lineage = [
        {"member": "member-0", "copied_from": None, "seconds": 0.0},
        {"member": "member-1", "copied_from": None, "seconds": 0.0},
        {"member": "member-0", "copied_from": "member-1", "seconds": 2.5},
    ]
    (tmp_path / "lineage.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lineage))
    for name in ("member-0", "member-1"):
        (tmp_path / name).mkdir()
        with open(tmp_path / name / "metrics.csv", "w", newline="") as fh:
            writer = csv.DictWriter(fh, COLUMNS)
            writer.writeheader()
            for s in range(5):
                writer.writerow(dict(zip(COLUMNS, (s, 100 * s, s, 10 * s, 10 * s), strict=True)))
    runs, marks = plot.read_population(tmp_path)
    assert [r.name for r in runs] == [f"{tmp_path.name}/member-0", f"{tmp_path.name}/member-1"]
    assert marks == [(2.5, 0, "member-0 from member-1")]
    assert plot.population_curves(tmp_path, 475.0).stat().st_size > 0


def test_bad_input_leaves_no_folder_behind(tmp_path):
    with pytest.raises(ValueError, match="population: must be >= 2"):
        pbt_run.setup(["--population", "1", "--run-dir", str(tmp_path / "population")])
    assert not (tmp_path / "population").exists()


def test_the_population_settings_stay_out_of_the_members_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("APEXRL_INTERVAL", "7")  # also the evaluator's `interval`
    config, population, _ = pbt_run.setup(["--population", "2", "--run-dir", str(tmp_path)])
    for member in population.members:
        member.close()
    population.lineage.close()
    assert config.interval == 7.0 and "APEXRL_INTERVAL" not in os.environ
    starts = [json.loads(line) for line in (tmp_path / "lineage.jsonl").read_text().splitlines()]
    assert [s["member"] for s in starts] == ["member-0", "member-1"]
    assert all(1e-5 <= s["settings"]["learning_rate"] <= 1e-1 for s in starts)
