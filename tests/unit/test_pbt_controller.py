"""PBT's controller on fake members with known scores: who copies whom, what is perturbed, and
the bounds and inputs it refuses."""

import math
import random

import pytest

from apexrl.pbt.controller import Explore, Member, Rules, check_rules, decide, perturb

LR = Explore("learning_rate", "log_uniform", (1e-5, 1e-1))


def members(scores: list[float], rates: list[float] | None = None) -> list[Member]:
    rates = rates or [10.0 ** -(2 + 0.3 * i) for i in range(len(scores))]
    return [
        Member(i, s, {"learning_rate": r})
        for i, (s, r) in enumerate(zip(scores, rates, strict=True))
    ]


def test_bottom_quarter_copies_the_top_quarter_with_the_winners_settings_perturbed():
    population = members([10.0, 500.0, 30.0, 200.0, 50.0, 20.0, 400.0, 5.0])
    decisions = decide(population, [LR], Rules(), random.Random(1))
    # 8 members, fraction 0.25: the two lowest (0: 10, 7: 5) copy the two highest (1, 6).
    assert sorted(d.loser for d in decisions) == [0, 7]
    for d in decisions:
        assert d.winner in (1, 6)
        winner_rate = population[d.winner].settings["learning_rate"]
        factor = d.settings["learning_rate"] / winner_rate
        assert d.how["learning_rate"] in ("x0.8", "x1.2")
        assert factor == pytest.approx(float(d.how["learning_rate"][1:]))


def test_members_without_a_score_are_neither_copied_nor_copy():
    population = members([math.nan, 100.0, math.nan, 10.0])
    (decision,) = decide(population, [LR], Rules(), random.Random(0))
    assert (decision.loser, decision.winner) == (3, 1)
    assert decide(members([math.nan, 100.0]), [LR], Rules(), random.Random(0)) == []


def test_ties_copy_nothing():
    assert decide(members([50.0, 50.0, 50.0, 50.0]), [LR], Rules(), random.Random(0)) == []


def test_same_seed_same_decisions():
    population = members([1.0, 2.0, 3.0, 4.0])
    runs = [
        decide(population, [LR], Rules(resample_probability=0.5), random.Random(7)) for _ in "ab"
    ]
    assert runs[0] == runs[1]


def test_perturbation_is_held_inside_the_bounds():
    rules = Rules(factors=(0.5, 3.0))
    for seed in range(20):
        new, how = perturb({"learning_rate": 0.09}, [LR], rules, random.Random(seed))
        assert 1e-5 <= new["learning_rate"] <= 1e-1
        if how["learning_rate"] == "x3":
            assert new["learning_rate"] == 1e-1


def test_resampling_draws_from_the_initial_distribution():
    rules = Rules(resample_probability=1.0)
    drawn = [perturb({"learning_rate": 0.05}, [LR], rules, random.Random(s)) for s in range(50)]
    assert all(how["learning_rate"] == "resampled" for _, how in drawn)
    rates = [new["learning_rate"] for new, _ in drawn]
    assert all(1e-5 <= r <= 1e-1 for r in rates)
    assert min(rates) < 1e-4 and max(rates) > 1e-2  # spread over the decades, not near 0.05


def test_values_are_each_members_initial_value_and_bounds():
    explore = Explore.of({"setting": "learning_rate", "values": [1e-4, 1e-3, 1e-2]}, 3)
    assert [explore.initial(i, random.Random(0)) for i in range(3)] == [1e-4, 1e-3, 1e-2]
    assert explore.bounds == (1e-4, 1e-2)


@pytest.mark.parametrize(
    "entry, population, named",
    [
        ({"log_uniform": [1e-5, 1e-1]}, 2, "setting = NAME"),
        ({"setting": "learning_rate"}, 2, "exactly one of"),
        ({"setting": "learning_rate", "uniform": [1, 2], "values": [1, 2]}, 2, "exactly one"),
        ({"setting": "learning_rate", "uniform": [1, 2], "spread": 3}, 2, "unknown keys: spread"),
        ({"setting": "learning_rate", "log_uniform": [0.0, 1.0]}, 2, "low > 0"),
        ({"setting": "learning_rate", "uniform": [2.0, 1.0]}, 2, "low <= high"),
        ({"setting": "learning_rate", "values": [1e-3]}, 2, "one per member"),
        ({"setting": "learning_rate", "values": ["fast", 1]}, 2, "array of numbers"),
    ],
)
def test_bad_explore_entries_name_the_setting(entry, population, named):
    with pytest.raises(ValueError, match=named):
        Explore.of(entry, population)


@pytest.mark.parametrize(
    "rules, named",
    [
        (Rules(factors=(0.8, 0.0)), "perturb: each factor must be > 0, got 0"),
        (Rules(factors=(-1.2,)), "perturb: each factor must be > 0, got -1.2"),
        (Rules(fraction=0.0), "fraction"),
        (Rules(fraction=0.6), "fraction"),
        (Rules(resample_probability=1.5), "resample_probability"),
    ],
)
def test_bad_rules_name_the_setting(rules, named):
    with pytest.raises(ValueError, match=named):
        check_rules(rules)
