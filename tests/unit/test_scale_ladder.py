"""benchmarks/scale_ladder.py: the checks that each lease answer of benchmarks/scale.py counts
the actors live when the learner answered, and places a new lease last, on made-up records
of actors that join, renew and leave (lease 3 s, a pull every second taking 0.1 s)."""

import importlib.util
from pathlib import Path

import pytest

from apexrl.algorithms.exploration import epsilon_ladder

PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "scale_ladder.py"
LEASE = 3.0


@pytest.fixture(scope="module")
def scale_ladder():
    spec = importlib.util.spec_from_file_location("scale_ladder", PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pull(t: float, index: int, count: int) -> tuple:
    """A pull at t answered with place `index` of `count`: (start, seconds, bytes, ok, index,
    count, exploration), as benchmarks/scale_actors.py records it."""
    return (t, 0.1, 100, True, index, count, epsilon_ladder(index, count))


def fleet() -> list[dict]:
    """Actor 0 pulls at 0..9 s; actor 1 joins at 0.5 s and leaves after its pull at 3.5 s (its
    lease lapses by 6.6 s); actor 2 joins at 5.5 s, when the other two are live."""
    a0 = [pull(0.0, 0, 1)] + [pull(t, 0, 2) for t in range(1, 6)]
    a0 += [pull(6.0, 0, 3)] + [pull(t, 0, 2) for t in range(7, 10)]
    a1 = [pull(t + 0.5, 1, 2) for t in range(4)]
    a2 = [pull(5.5, 2, 3)] + [pull(t + 0.5, 1, 2) for t in range(7, 10)]
    return [{"index": i, "pulls": p} for i, p in enumerate([a0, a1, a2])]


def test_a_fleet_whose_answers_follow_the_leases_is_exact(scale_ladder):
    out = scale_ladder.ladder(fleet(), 2, (0.0, 10.0), LEASE, churn=True)
    assert out["exact"], out
    assert out["new_leases"] == 3 and out["renewed"] == 0
    assert out["expired"] == 1  # actor 1's lease lapsed while the others were answered
    assert out["counts_in_window"] == [1, 3]


def test_an_expired_lease_still_counted_fails(scale_ladder):
    records = fleet()
    records[0]["pulls"][9] = pull(9.0, 0, 3)  # actor 1 left at 3.6 s: gone by 9 s
    out = scale_ladder.ladder(records, 2, (0.0, 10.0), LEASE, churn=True)
    assert not out["live"] and not out["exact"]


def test_a_live_lease_left_out_fails(scale_ladder):
    records = fleet()
    records[0]["pulls"][2] = pull(2.0, 0, 1)  # actor 1 renewed at 1.5 s: live at 2 s
    out = scale_ladder.ladder(records, 2, (0.0, 10.0), LEASE, churn=True)
    assert not out["live"] and not out["exact"]


def test_a_new_lease_not_last_or_a_place_that_rises_fails(scale_ladder):
    records = fleet()
    records[2]["pulls"][0] = pull(5.5, 0, 3)  # a newcomer ahead of the two live ones
    assert not scale_ladder.ladder(records, 2, (0.0, 10.0), LEASE, churn=True)["new_leases_last"]
    records = fleet()
    records[0]["pulls"][5] = pull(5.0, 1, 2)  # the first actor moves back
    out = scale_ladder.ladder(records, 2, (0.0, 10.0), LEASE, churn=True)
    assert not out["places_never_rise"] and not out["exact"]


def test_a_lapsed_lease_renewed_takes_the_last_place(scale_ladder):
    """Actor 1 falls silent past its lease, then pulls again: a new lease, counted once."""
    records = fleet()[:2]
    records[1]["pulls"] = [pull(0.5, 1, 2), pull(1.5, 1, 2), pull(6.0, 1, 2), pull(7.0, 1, 2)]
    records[0]["pulls"] = [pull(0.0, 0, 1), pull(1.0, 0, 2), pull(2.0, 0, 2), pull(3.0, 0, 2)]
    records[0]["pulls"] += [pull(5.0, 0, 1), pull(6.5, 0, 2), pull(8.0, 0, 2)]
    out = scale_ladder.ladder(records, 2, (0.0, 10.0), LEASE, churn=False)
    assert out["exact"], out
    assert out["renewed"] == 1 and out["expired"] == 1 and out["places"]
