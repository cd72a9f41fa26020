"""The exploration ladder that benchmarks/scale.py's simulated actors were handed, checked
against the leases the learner held at each answer.

The learner (services/learner/leases.py) holds an actor's lease while its newest renewal is
at most lease_seconds old, and gives actor i of the N live ones, ordered by when their
leases began, the exploration epsilon_ladder(i, N). The actors record each pull's start and
end on the machine's monotonic clock, which the learner reads too: it renewed the caller's
lease at some moment within the call. So for every answer:

- formula: its exploration is epsilon_ladder(index, count), with 0 <= index < count;
- live: count lies between the actors whose leases were certainly live throughout the call
  (a renewal that ended before the call began and began at most lease_seconds before it
  ended) and those possibly live at some moment of it (a call of theirs that overlaps the
  lease_seconds before the call or the call itself), the caller included: expired leases
  are not counted, live ones are;
- new_leases_last: an answer to an actor whose previous call ended more than lease_seconds
  before this one began (or that has none: it just joined) starts a lease, so holds the last
  place, index count - 1;
- places_never_rise: within a lease (the previous call began at most lease_seconds before
  this one ended) an actor's place never rises: only actors ahead of it can leave.

Churn, pauses past the lease and a loaded machine (a renewal late past its lease) all change
the counts; the checks hold through each. `expired` counts the leases that certainly lapsed
while another actor's answer came (that answer must not count them), `renewed` the leases
begun again after one lapsed.
"""

import numpy as np

from apexrl.algorithms.exploration import epsilon_ladder


def spans(pulls: list[tuple], ok_only: bool) -> np.ndarray:
    """(start, end) of an actor's pulls, in order (one thread makes them, one after another)."""
    rows = [(p[0], p[0] + p[1]) for p in pulls if p[3] or not ok_only]
    return np.array(rows, dtype=np.float64).reshape(-1, 2)


def certainly_live(calls: np.ndarray, start: np.ndarray, end: np.ndarray, lease: float):
    """Per answer (start, end): an actor with these renewals held a lease all through it."""
    if not len(calls):
        return np.zeros(len(start), bool)
    k = np.searchsorted(calls[:, 1], start, side="right") - 1  # the newest call over by then
    return (k >= 0) & (calls[np.maximum(k, 0), 0] >= end - lease)


def possibly_live(calls: np.ndarray, start: np.ndarray, end: np.ndarray, lease: float):
    """Per answer (start, end): an actor with these calls may have held a lease during it."""
    if not len(calls):
        return np.zeros(len(start), bool)
    k = np.searchsorted(calls[:, 1], start - lease, side="left")  # the first still counting
    return (k < len(calls)) & (calls[np.minimum(k, len(calls) - 1), 0] <= end)


def live_counts(records: list[dict], lease: float) -> tuple[bool, int]:
    """Whether every answer's count lies within its bounds; the leases that lapsed while
    another actor's answer came."""
    answers = [(r["index"], p[0], p[0] + p[1], p[5]) for r in records for p in r["pulls"] if p[3]]
    if not answers:
        return False, 0
    owner, start, end, count = (np.array(column) for column in zip(*answers, strict=True))
    low, high = np.ones(len(answers), int), np.ones(len(answers), int)  # the caller itself
    expired = 0
    for r in records:
        others = owner != r["index"]
        every = spans(r["pulls"], ok_only=False)
        low += others & certainly_live(spans(r["pulls"], ok_only=True), start, end, lease)
        high += others & possibly_live(every, start, end, lease)
        # A lapse: after a call, no other for lease_seconds; counted where an answer fell in it.
        following = np.append(every[1:, 0], np.inf)
        for last_end, next_start in zip(every[:, 1], following, strict=True):
            if next_start > last_end + lease:
                expired += bool(np.any(others & (start > last_end + lease) & (end < next_start)))
    return bool(np.all((low <= count) & (count <= high))), expired


def places(records: list[dict], lease: float) -> dict:
    """new_leases_last and places_never_rise over every actor's answers, in order."""
    last_place = never_rise = True
    new = renewed = 0
    for r in records:
        previous = None  # (start, end, ok, index) of the actor's previous call
        for start, seconds, _, ok, index, count, _ in r["pulls"]:
            end = start + seconds
            if ok and (previous is None or previous[1] < start - lease):
                new += 1
                renewed += previous is not None
                last_place &= index == count - 1
            elif ok and previous[2] and end - previous[0] <= lease:
                never_rise &= index <= previous[3]
            previous = (start, end, ok, index)
    return {
        "new_leases_last": last_place,
        "places_never_rise": never_rise,
        "new_leases": new,
        "renewed": renewed,
    }


def ladder(records: list[dict], n: int, window: tuple[float, float], lease: float, churn: bool):
    """The checks above; without churn also that the actors' last answers hold places
    0 .. n-1, once each. `exact`: every check holds."""
    pulls = [p for r in records for p in r["pulls"] if p[3]]
    formula = all(0 <= i < c and e == epsilon_ladder(i, c) for *_, i, c, e in pulls)
    live, expired = live_counts(records, lease)
    out = {"formula": formula, "live": live, **places(records, lease), "expired": expired}
    if not churn:
        last = sorted(r["pulls"][-1][4] for r in records if r["pulls"] and r["pulls"][-1][3])
        out["places"] = last == list(range(n))
    counts = [p[5] for p in pulls if window[0] <= p[0] < window[1]]
    out["counts_in_window"] = [min(counts), max(counts)] if counts else []
    out["exact"] = all(v for v in out.values() if isinstance(v, bool)) and bool(counts)
    return out
