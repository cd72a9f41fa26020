"""64 simulated actors against a real learner and replay (benchmarks/scale.py, its docstring
has the details), for correctness only: every insert the clients saw acknowledged is in
replay and no other, every exploration value the learner hands out is the ladder's for the
actor's place, and leases expire and renew: 8 actors fall silent past their lease mid-run
and come back at the end of the ladder, every answer counts the actors whose leases were
live when the learner gave it (benchmarks/scale_ladder.py), and a new lease takes the last
place. From the learner, 2% of the actors leave a second (their leases lapse) and as many
new ones join; through a relay, none do, and the last answers hold every place of 64 once.

CartPole keeps it small (its learner starts in seconds, its parameters weigh KBs); the
cadence is fast (a pull a second, a 2.5 s lease) so that all of it fits one short window.
The same again with the parameters pulled through a parameter relay: the leases, renewed
with lease_only calls to the learner, keep the ladder exact.
"""

from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("relays", "churn"), [(0, 0.02), (1, 0.0)], ids=["from-the-learner-churn", "through-a-relay"]
)
def test_sixty_four_actors_lose_no_insert_and_hold_exact_places(
    monkeypatch, tmp_path, relays, churn
):
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # spawned actor processes inherit sys.path
    import scale

    settings = scale.Settings(
        actors=(64,),
        seconds=12.0,
        baseline_actors=0,
        env="CartPole-v1",
        steps_per_s=100.0,
        pull_interval=100,
        lease_seconds=2.5,
        recorded=640,
        capacity=50_000,
        paused=8,
        pin=False,
        relays=relays,
        churn=churn,
    )
    (report,) = scale.run(settings, tmp_path)
    assert report["errors"] == 0, report["error_messages"]
    assert report["inserts_lost"] == 0
    assert report["inserts_accepted_per_s"] > 0 and report["pulls_per_s"] > 0
    # Through a relay, every pull's parameters came from it (and none without).
    pulls = report["pulls_per_s"] * report["seconds"]
    assert (report["relay_answers"] >= pulls) if relays else report["relay_answers"] == 0
    assert report["learner_parameter_bytes_sent_per_s"] > 0
    ladder = report["ladder"]
    assert ladder["formula"], "an exploration value differs from epsilon_ladder(index, count)"
    assert ladder["live"], "an answer counts other than the actors with live leases"
    assert ladder["new_leases_last"], "a new lease did not take the last place"
    assert ladder["places_never_rise"], "a place rose within a lease"
    # The 8 silent actors' leases lapsed while others were answered, and they came back.
    assert ladder["expired"] >= 8 and ladder["renewed"] >= 8
    if churn:  # ~1.3 a second over the ~12 s after the first pull period
        assert report["churn_left"] == report["churn_joined"] >= 8
        assert ladder["expired"] >= 8 + report["churn_left"] // 2
        assert ladder["counts_in_window"][1] > 64, "the leavers' leases outlast them a while"
    else:
        assert report["churn_left"] == report["churn_joined"] == 0
        assert ladder["places"], "the last answers do not hold places 0 .. 63 once each"
    assert report["ladder_exact"]
