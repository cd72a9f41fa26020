"""The sequence adder on a hand-built stream: sequences overlap by the period, never cross an
episode end, a short tail is padded and masked, each carries the state, exploration parameter
and version of its first step; bad input names what is wrong and changes nothing."""

import numpy as np
import pytest

from apexrl.algorithms.adders.sequence import SequenceAdder, check_sequence
from apexrl.algorithms.base import Step

FINAL = 100.0  # an episode's final observation, distinct from every step's
GAMMA = 0.5


def adder(num_envs=1, length=4, period=2):
    return SequenceAdder(num_envs, length, period, (1,), np.float32, state_size=2, gamma=GAMMA)


def feed(a: SequenceAdder, obs, ends=None, truncated=None, version=0, acting=False):
    """One step of every env: env i sees obs[i] (also its state and reward: obs * 10, obs + 1);
    next_obs is obs + 1, the final observation FINAL where an episode ended. `acting`: the
    policy also gives the Q-values it acted on ([obs, 2 obs]) and the state after ([obs, 7])."""
    obs = np.asarray(obs, np.float32)
    n = len(obs)
    ends = np.zeros(n, bool) if ends is None else np.asarray(ends)
    truncated = np.zeros(n, bool) if truncated is None else np.asarray(truncated)
    next_obs = (obs + 1)[:, None]
    final = np.where((ends | truncated)[:, None], FINAL, next_obs)
    extras = {"state": np.stack([obs * 10, -obs], 1), "exploration": obs / 100}
    if acting:
        extras |= {"q": np.stack([obs, 2 * obs], 1), "next_state": np.stack([obs, obs * 0 + 7], 1)}
    step = Step(obs[:, None], obs.astype(np.int64), extras, obs + 1, ends, truncated, next_obs,
                final, version)  # fmt: skip
    return a.add(step)


def run(a, steps, end="terminated", acting=False):
    """One env through an episode of `steps` steps (obs 0, 1, ...); the items, in order."""
    items = []
    for t in range(steps):
        last = t == steps - 1
        ends, truncated = [last and end == "terminated"], [last and end == "truncated"]
        out = feed(a, [t], ends, truncated, 1000 + t, acting)
        if out is not None:
            items += [{k: v[i] for k, v in out.items()} for i in range(len(out["mask"]))]
    return items


def test_sequences_overlap_by_the_period_and_the_tail_is_padded_and_masked():
    items = run(adder(), 9)
    starts = [item["observations"][0, 0] for item in items]
    assert starts == [0, 2, 4, 6]  # full at steps 4, 6, 8; the episode's end adds the one from 6
    np.testing.assert_array_equal(items[0]["observations"][:, 0], [0, 1, 2, 3, 4])
    np.testing.assert_array_equal(items[1]["observations"][:, 0], [2, 3, 4, 5, 6])
    np.testing.assert_array_equal(items[2]["observations"][:, 0], [4, 5, 6, 7, 8])
    tail = items[3]
    np.testing.assert_array_equal(tail["observations"][:, 0], [6, 7, 8, FINAL, 0])
    np.testing.assert_array_equal(tail["mask"], [1, 1, 1, 0])
    np.testing.assert_array_equal(tail["actions"], [6, 7, 8, 0])
    np.testing.assert_array_equal(tail["rewards"], [7, 8, 9, 0])
    np.testing.assert_array_equal(tail["discounts"], [GAMMA, GAMMA, 0, 0])  # terminal, then pad
    np.testing.assert_array_equal(items[1]["mask"], [1, 1, 1, 1])
    np.testing.assert_array_equal(items[1]["discounts"], [GAMMA] * 4)


def test_each_sequence_carries_its_first_steps_state_exploration_and_version():
    items = run(adder(), 9)
    for item in items:
        first = item["observations"][0, 0]
        np.testing.assert_array_equal(item["state"], [first * 10, -first])
        assert item["exploration"] == pytest.approx(first / 100, rel=1e-6)
        assert item["version"] == 1000 + first
    assert items[0]["state"].dtype == np.float32 and items[0]["version"].dtype == np.int64


def test_the_values_acted_on_travel_with_each_sequence_for_its_priorities_only():
    assert "acting_q" not in run(adder(), 9)[0]  # a policy that gives none
    items = run(adder(), 9, acting=True)
    np.testing.assert_array_equal(items[1]["acting_q"], [[2, 4], [3, 6], [4, 8], [5, 10]])
    np.testing.assert_array_equal(items[1]["last_state"], [5, 7])  # after its last step, 5
    tail = items[3]  # steps 6, 7, 8, then padding
    np.testing.assert_array_equal(tail["acting_q"], [[6, 12], [7, 14], [8, 16], [0, 0]])
    np.testing.assert_array_equal(tail["last_state"], [8, 7])
    assert SequenceAdder.acting_fields == ("acting_q", "last_state")


def test_an_end_at_a_full_sequence_adds_no_tail_and_the_next_episode_starts_afresh():
    a = adder()
    first = run(a, 6)  # full at steps 4 and 6, the second ends at the episode's end
    assert [item["observations"][0, 0] for item in first] == [0, 2]
    np.testing.assert_array_equal(first[1]["observations"][:, 0], [2, 3, 4, 5, FINAL])
    np.testing.assert_array_equal(first[1]["discounts"], [GAMMA, GAMMA, GAMMA, 0])
    second = run(a, 4)  # a new episode: its own first sequence, nothing of the last one's
    assert [item["observations"][0, 0] for item in second] == [0]
    np.testing.assert_array_equal(second[0]["mask"], [1, 1, 1, 1])


def test_a_truncated_short_episode_keeps_its_bootstrap():
    items = run(adder(), 2, end="truncated")
    assert len(items) == 1
    np.testing.assert_array_equal(items[0]["observations"][:, 0], [0, 1, FINAL, 0, 0])
    np.testing.assert_array_equal(items[0]["discounts"], [GAMMA, GAMMA, 0, 0])
    np.testing.assert_array_equal(items[0]["mask"], [1, 1, 0, 0])


def test_envs_end_apart_and_no_sequence_crosses_an_end():
    a = adder(num_envs=2, length=3, period=3)
    out = feed(a, [0, 10], ends=[False, True])  # env 1's episode is one step long
    np.testing.assert_array_equal(out["observations"][:, :, 0], [[10, FINAL, 0, 0]])
    np.testing.assert_array_equal(out["mask"], [[1, 0, 0]])
    assert feed(a, [1, 20]) is None
    out = feed(a, [2, 21])
    np.testing.assert_array_equal(out["observations"][:, :, 0], [[0, 1, 2, 3]])
    out = feed(a, [3, 22])  # env 1's second episode fills its first sequence
    np.testing.assert_array_equal(out["observations"][:, :, 0], [[20, 21, 22, 23]])


def test_a_state_of_the_wrong_size_is_refused_naming_it_and_changes_nothing():
    a = adder()
    run(a, 3, end="none")
    before = a.steps.copy(), a.obs.copy()
    step = Step(np.zeros((1, 1), np.float32), np.zeros(1, np.int64),
                {"state": np.zeros((1, 3), np.float32), "exploration": np.zeros(1, np.float32)},
                np.zeros(1, np.float32), np.zeros(1, bool), np.zeros(1, bool),
                np.zeros((1, 1), np.float32), np.zeros((1, 1), np.float32), 0)  # fmt: skip
    with pytest.raises(ValueError, match=r"^state: .*\[1, 2\].*got \[1, 3\]"):
        a.add(step)
    np.testing.assert_array_equal(a.steps, before[0])
    np.testing.assert_array_equal(a.obs, before[1])


@pytest.mark.parametrize(
    ("length", "period", "burn_in", "setting"),
    [(0, 1, 0, "sequence_length"), (4, 5, 0, "sequence_period"), (4, 0, 0, "sequence_period"),
     (4, 2, 4, "burn_in"), (4, 2, -1, "burn_in")],
)  # fmt: skip
def test_bad_settings_are_refused_naming_them(length, period, burn_in, setting):
    with pytest.raises(ValueError, match=f"^{setting}: "):
        check_sequence(length, period, burn_in)
