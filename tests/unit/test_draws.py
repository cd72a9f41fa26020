"""Settings drawn per actor (draws.py): the distributions, their seeding, where they are taken
and where refused."""

import math
import tomllib

import numpy as np
import pytest
from scipy import stats

from apexrl import algorithms, draws
from apexrl import config as cfg
from apexrl.actor.loop import exploration
from apexrl.algorithms.exploration import epsilon_ladder
from apexrl.local.settings import parse as local_parse
from apexrl.local.supervision import Run

N = 4000


def actor(*flags: str) -> cfg.ActorConfig:
    return cfg.parse(cfg.ActorConfig, list(flags), "actor", "apexrl actor", algorithms.REGISTRY)


def many(text: str, name: str = "exploration", integer: bool = False) -> np.ndarray:
    draw = draws.parse(text, name, integer=integer)
    rng = np.random.default_rng(1)
    return np.array([draw.draw(rng) for _ in range(N)])


def test_log_uniform_draws_stay_within_bounds_with_a_uniform_log():
    values = many("{ log_uniform = [0.01, 0.4] }")
    assert values.min() >= 0.01 and values.max() <= 0.4
    logs = (np.log(values) - math.log(0.01)) / (math.log(0.4) - math.log(0.01))
    assert stats.kstest(logs, "uniform").pvalue > 0.01
    # The same test tells a uniform draw over the same bounds apart: it can fail.
    plain = (np.log(many("{ uniform = [0.01, 0.4] }")) - math.log(0.01)) / math.log(40)
    assert stats.kstest(plain, "uniform").pvalue < 1e-6


def test_uniform_and_choice_draws_spread_evenly():
    values = many("{ uniform = [0.2, 0.7] }")
    assert values.min() >= 0.2 and values.max() <= 0.7
    assert stats.kstest((values - 0.2) / 0.5, "uniform").pvalue > 0.01
    for text in ("{ choice = [1, 3, 5] }", "{ uniform = [1, 3] }"):
        values = many(text, "n_step", integer=True)
        kinds, counts = np.unique(values, return_counts=True)
        expected = [1, 3, 5] if "choice" in text else [1, 2, 3]
        assert kinds.tolist() == expected and all(isinstance(v, int) for v in values[:5].tolist())
        assert stats.chisquare(counts).pvalue > 0.01


def test_the_same_seed_draws_the_same_and_each_setting_its_own():
    flags = [
        "--exploration",
        "{ log_uniform = [0.01, 0.4] }",
        "--gamma",
        "{ uniform = [0.01, 0.4] }",
    ]
    first = draws.draw_settings(actor(*flags, "--seed", "7"))[1]
    again = draws.draw_settings(actor(*flags, "--seed", "7"))[1]
    other = draws.draw_settings(actor(*flags, "--seed", "8"))[1]
    assert first == again and first["exploration"] != other["exploration"]
    assert first["gamma"] != first["exploration"]  # the name seeds it too
    # seed 0: from the OS, so actors sharing a config file draw apart.
    assert len({draws.draw_settings(actor(*flags))[1]["gamma"] for _ in range(3)}) == 3


def test_an_actor_config_gets_its_draws_and_keeps_its_ladder():
    config = actor("--n-step", "{ choice = [2, 4] }", "--exploration", "{ ladder = [0.4, 0.1] }")
    assert isinstance(config.algo.n_step, draws.Draw) and config.algo.n_step == 2
    drawn, values = draws.draw_settings(config)
    assert drawn.algo.n_step in (2, 4) and values == {"n_step": drawn.algo.n_step}
    assert drawn.exploration is config.exploration  # a ladder is read at each pull
    assert exploration(drawn.exploration, 0.4, 0, (1, 3)) == pytest.approx(0.2)


def test_a_ladder_with_the_ape_x_ends_is_the_epsilon_ladder():
    ladder = draws.parse("{ ladder = [0.4, 0.00065536] }", "exploration", ladder=True)
    for i, n in [(0, 1), (0, 5), (2, 5), (4, 5), (7, 8)]:
        assert ladder.at(i, n) == pytest.approx(epsilon_ladder(i, n))


def test_local_mode_hands_the_distributions_to_its_actors(tmp_path):
    """Every actor of local mode gets the distributions (and draws its own); a shared one goes
    to [actor] alone (the file's top-level keys hold numbers), and an algorithm that keeps one
    value for all refuses it before any process starts."""
    flags = ["--algorithm", "dqn", "--gamma", "{ log_uniform = [0.9, 0.99] }"]
    run = Run(local_parse([*flags, "--n-step", "{ choice = [1, 5] }"]), {}, tmp_path / "run")
    written = tomllib.loads(run.config_path.read_text())
    assert written["actor"]["gamma"] == {"log_uniform": [0.9, 0.99]} and "gamma" not in written
    assert written["dqn"]["n_step"] == {"choice": [1, 5]}
    config = actor("--config", str(run.config_path))
    assert (config.gamma.toml(), config.algo.n_step.toml()) == (
        "{ log_uniform = [0.9, 0.99] }",
        "{ choice = [1, 5] }",
    )
    with pytest.raises(ValueError, match="^gamma: r2d2 takes one value for every actor"):
        Run(local_parse(["--algorithm", "r2d2", *flags[2:]]), {}, tmp_path / "r2d2")


def test_the_actors_of_a_seeded_local_run_draw_apart(tmp_path, monkeypatch):
    """Local mode gives actor i of a seeded run the seed + i: one shared seed would give every
    actor the same draw, and a run seeded again draws the same values again."""
    flags = ["--algorithm", "dqn", "--actors", "4", "--seed", "11"]
    run = Run(local_parse([*flags, "--gamma", "{ uniform = [0.9, 0.99] }"]), {}, tmp_path / "run")
    launched = []
    monkeypatch.setattr(run, "launch", lambda name, command, *f: launched.append((command, f)))
    monkeypatch.setattr(run, "wait_ready", lambda children: None)
    run.start_all()
    drawn = [
        draws.draw_settings(actor("--config", str(run.config_path), *f))[1]["gamma"]
        for command, f in launched
        if command == "actor"
    ]
    assert len(drawn) == 4 and len(set(drawn)) == 4, drawn
    seeded = draws.draw_settings(actor("--config", str(run.config_path), "--seed", "13"))[1]
    assert drawn[2] == seeded["gamma"]


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--exploration", "{ normal = [0, 1] }"], "^exploration: a number, a schedule, or a"),
        (["--exploration", "{ uniform = [0.4, 0.1] }"], "^exploration: uniform needs low <= h"),
        (["--exploration", "{ log_uniform = [0, 0.4] }"], "^exploration: log_uniform needs bou"),
        (["--exploration", "{ uniform = [0.1] }"], r"^exploration: uniform takes \[low, high"),
        (["--exploration", "{ choice = [] }"], "^exploration: choice takes a list of numbers"),
        (["--n-step", "{ ladder = [1, 5] }"], "^n_step: a ladder follows the actor's place"),
        (["--n-step", "{ choice = [1, 2.5] }"], "^n_step: an integer setting"),
        (["--n-step", "{ log_uniform = [1, 5] }"], "^n_step: an integer setting takes uniform"),
        (["--n-step", "{ normal = [1, 5] }"], "^n_step: a number, or a per-actor distribution"),
        (["--n-step", "{ choice = [0, 3] }"], "^n_step: must be >= 1"),
        (["--gamma", "{ uniform = [0.9, 1.2] }"], r"^gamma: must be in \[0.0, 1.0\]"),
    ],
)
def test_a_bad_distribution_is_refused_naming_the_setting(flags, message):
    with pytest.raises(ValueError, match=message):
        algorithms.make(actor(*flags))


def test_the_learners_settings_refuse_a_distribution(tmp_path):
    def learner(*flags: str) -> cfg.LearnerConfig:
        config = cfg.parse(cfg.LearnerConfig, list(flags), "learner", "x", algorithms.REGISTRY)
        return algorithms.make(config)

    with pytest.raises(ValueError, match="^learning_rate: takes no per-actor distribution"):
        learner("--learning-rate", "{ log_uniform = [1e-4, 1e-3] }")
    with pytest.raises(ValueError, match="^gamma: r2d2 takes one value for every actor"):
        learner("--algorithm", "r2d2", "--gamma", "{ uniform = [0.9, 0.99] }")
    path = tmp_path / "run.toml"
    path.write_text("[r2d2]\nn_step = { choice = [1, 5] }\n")
    with pytest.raises(ValueError, match="run.toml: n_step: takes no per-actor distribution"):
        learner("--algorithm", "r2d2", "--config", str(path))
    path.write_text("[actor]\nnum_envs = { choice = [1, 2] }\n")
    with pytest.raises(ValueError, match="run.toml: num_envs: takes no per-actor distribution"):
        actor("--config", str(path))
    # dqn's learner reads neither: the actors' items carry their discounts.
    made = learner("--gamma", "{ uniform = [0.9, 0.99] }", "--n-step", "{ choice = [1, 5] }")
    assert made.config.gamma.shape == "uniform" and made.settings.n_step.shape == "choice"
    # An r2d2 actor refuses a drawn gamma before it draws.
    with pytest.raises(ValueError, match="^gamma: r2d2 takes one value for every actor"):
        algorithms.get("r2d2").refuse_draws(
            actor("--algorithm", "r2d2", "--gamma", "{ uniform = [0.9, 0.99] }")
        )
