"""64 simulated actors against a real learner and replay (benchmarks/scale.py, its docstring
has the details), for correctness only: every insert the clients saw acknowledged is in
replay and no other, every exploration value the learner hands out is the ladder's for the
actor's place, and leases expire and renew: 8 actors fall silent past their lease mid-run,
the others' answers count 56 live actors meanwhile, the 8 come back at the end of the
ladder, and the last answers hold every place of 64 once.

CartPole keeps it small (its learner starts in seconds, its parameters weigh KBs); the
cadence is fast (a pull a second, a 2.5 s lease) so that all of it fits one short window.
The same again with the parameters pulled through a parameter relay: the leases, renewed
with lease_only calls to the learner, keep the ladder exact.
"""

from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("relays", [0, 1], ids=["from-the-learner", "through-a-relay"])
def test_sixty_four_actors_lose_no_insert_and_hold_exact_places(monkeypatch, tmp_path, relays):
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
    assert ladder["counts_in_window"] == [64]
    assert ladder["expired"], "the silent actors' leases did not lapse"
    assert ladder["renewed"], "the returning actors did not take new places at the end"
    assert ladder["places"], "the last answers do not hold places 0 .. 63 once each"
    assert report["ladder_exact"]
