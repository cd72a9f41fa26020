"""What every adder promises beyond its windows: items in the dtypes of their table's columns
whatever dtypes the env and policy hand it, `add(step)` as the step's `record`, its defaults,
and the arguments it refuses, word for word."""

import numpy as np
import pytest

from apexrl.algorithms.adders.nstep import NStepAdder
from apexrl.algorithms.adders.sequence import SequenceAdder, check_sequence
from apexrl.algorithms.adders.unroll import UnrollAdder
from apexrl.algorithms.base import Step
from apexrl.algorithms.unreal.adders import RewardWindowAdder


def step(t: int, n: int = 2, actions=None, ends=None, truncated=None, extras=None) -> Step:
    """Step t of n envs, in the widest dtypes an env gives (float64 observations and rewards,
    int32 actions): obs t + env, rewards 10 t + env."""
    obs = (t + np.arange(n, dtype=np.float64))[:, None]
    ends = np.zeros(n, bool) if ends is None else np.asarray(ends)
    truncated = np.zeros(n, bool) if truncated is None else np.asarray(truncated)
    final = np.where((ends | truncated)[:, None], 100.0, obs + 1)
    actions = np.arange(n, dtype=np.int32) if actions is None else actions
    return Step(
        obs,
        actions,
        extras or {},
        10.0 * t + np.arange(n, dtype=np.float64),
        ends,
        truncated,
        obs + 1,
        final,
        7,
    )


def dtypes(item: dict[str, np.ndarray]) -> dict[str, str]:
    return {name: str(array.dtype) for name, array in item.items()}


def test_nstep_add_is_record_of_the_steps_fields_in_float32_columns():
    by_add, by_record = NStepAdder(2, 2, 0.5), NStepAdder(2, 2, 0.5)
    for t in range(4):
        s = step(t, ends=[t == 2, False], truncated=[False, t == 3])
        got = by_add.add(s)
        want = by_record.record(s.obs, s.actions, s.rewards, s.ends, s.truncated, s.final_obs)
        assert (got is None) == (want is None)
        if got is not None:
            assert got.keys() == want.keys()
            for name in got:
                np.testing.assert_array_equal(got[name], want[name], err_msg=name)
            assert dtypes(got)["reward"] == dtypes(got)["discount"] == "float32"
    assert by_add.table == "default" and by_add.gamma == 0.5


def test_nstep_takes_vector_actions_and_the_bounds_of_gamma():
    """dpg's actions are [num_envs, action_dim]; gamma 0 and 1 are both allowed."""
    for gamma in (0.0, 1.0):
        adder = NStepAdder(2, 1, gamma)
        actions = np.array([[0.5, -0.5, 1.0], [1.0, 0.0, -1.0]], np.float32)
        item = adder.add(step(0, actions=actions))
        np.testing.assert_array_equal(item["action"], actions)
        np.testing.assert_allclose(item["discount"], [gamma, gamma])


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: NStepAdder(0, 3, 0.9), "num_envs must be >= 1, got 0"),
        (
            lambda: NStepAdder(2, 3, 0.9).record(
                np.zeros((2, 1)),
                np.zeros(2),
                np.zeros(2),
                np.zeros(2, bool),
                np.zeros(2, bool),
                np.zeros((2, 2)),
            ),
            "next_obs shape (2, 2) differs from obs shape (2, 1)",
        ),
        (
            lambda: NStepAdder(2, 3, 0.9).record(
                np.zeros((2, 1)),
                np.zeros(3),
                np.zeros(2),
                np.zeros(2, bool),
                np.zeros(2, bool),
                np.zeros((2, 1)),
            ),
            "expected 2 envs, got obs (2, 1) and actions (3,)",
        ),
        (lambda: SequenceAdder(0, 4, 2, (1,), np.float32, 2, 0.9), "num_envs: must be >= 1, got 0"),
        (
            lambda: SequenceAdder(2, 4, 5, (1,), np.float32, 2, 0.9),
            "sequence_period: must be 1 to sequence_length (4), got 5 (a larger period would"
            " leave steps out of every sequence)",
        ),
        (
            lambda: check_sequence(4, 2, 4),
            "burn_in: must be 0 to sequence_length - 1 (3), got 4 (the learner would have no"
            " step left to learn from)",
        ),
        (lambda: UnrollAdder(0, 3, (1,), np.float32), "num_envs and length must be >= 1, got 0, 3"),
        (lambda: UnrollAdder(2, 0, (1,), np.float32), "num_envs and length must be >= 1, got 2, 0"),
    ],
)
def test_bad_arguments_are_refused_word_for_word(make, message):
    with pytest.raises(ValueError) as caught:
        make()
    assert message in str(caught.value)
    assert str(caught.value)  # never an empty message


def test_sequence_items_carry_their_columns_dtypes():
    adder = SequenceAdder(2, 2, 2, (1,), np.float32, state_size=2, gamma=0.9)
    assert adder.table == "default"
    items = None
    for t in range(2):
        extras = {
            "state": np.ones((2, 2), np.float64) * t,
            "exploration": np.full(2, 0.25, np.float64),
            "q": np.ones((2, 3), np.float64),
            "next_state": np.ones((2, 2), np.float64),
        }
        out = adder.add(step(t, extras=extras, ends=[t == 1, False]))
        items = out if out is not None else items
    got = dtypes(items)
    for name in ("rewards", "discounts", "mask", "state", "exploration", "last_state", "acting_q"):
        assert got[name] == "float32", name
    assert got["actions"] == "int64"
    np.testing.assert_allclose(items["exploration"], 0.25)


def test_sequence_tails_are_padded_in_their_columns_dtypes():
    adder = SequenceAdder(1, 4, 2, (1,), np.float32, state_size=2, gamma=0.9)
    items = None
    for t in range(3):
        extras = {"state": np.zeros((1, 2)), "exploration": np.zeros(1)}
        out = adder.add(step(t, n=1, extras=extras, ends=[t == 2]))
        items = out if out is not None else items
    assert items["mask"].tolist() == [[1, 1, 1, 0]]
    got = dtypes(items)
    assert got["actions"] == "int64" and got["rewards"] == got["mask"] == "float32"


def test_unroll_add_bootstraps_truncations_from_the_values_and_keeps_the_log_probs():
    values_asked = []

    def values(obs):
        values_asked.append(obs.copy())
        return np.full(len(obs), 2.0, np.float64)

    adder = UnrollAdder(2, 2, (1,), np.float64, values=values)
    assert adder.table == "default" and adder.gamma == 0.99
    log_probs = np.array([-0.5, -1.5], np.float64)
    assert adder.add(step(0, extras={"log_probs": log_probs})) is None
    item = adder.add(step(1, extras={"log_probs": log_probs}, truncated=[False, True]))
    np.testing.assert_array_equal(values_asked[0], [[100.0]])
    np.testing.assert_allclose(item["rewards"], [[0, 10], [1, 11 + 0.99 * 2]])
    np.testing.assert_allclose(item["discounts"], [[0.99, 0.99], [0.99, 0.0]], rtol=1e-6)
    np.testing.assert_allclose(item["log_probs"], [[-0.5, -0.5], [-1.5, -1.5]])
    np.testing.assert_array_equal(item["version"], [7, 7])
    got = dtypes(item)
    assert got["rewards"] == got["discounts"] == got["log_probs"] == "float32"
    assert got["version"] == got["actions"] == "int64"


def test_one_env_unrolls_of_one_step_are_allowed():
    adder = UnrollAdder(1, 1, (1,), np.float32)
    item = adder.record(
        np.zeros((1, 1)), np.zeros(1), np.zeros(1), np.ones(1), np.ones(1), np.ones((1, 1)), 3
    )
    assert item["observations"].shape == (1, 2, 1)


def test_sequences_of_one_step_every_step_are_allowed():
    """The smallest settings: length 1, period 1, no burn-in (the adder's default); each step
    is its own item."""
    check_sequence(1, 1, 0)
    check_sequence(4, 1, 3)
    adder = SequenceAdder(1, 1, 1, (1,), np.float32, state_size=2, gamma=0.9)
    rewards = []
    for t in range(3):
        extras = {"state": np.zeros((1, 2)), "exploration": np.zeros(1)}
        item = adder.add(step(t, n=1, extras=extras, ends=[t == 2]))
        assert item["observations"].shape == (1, 2, 1) and item["mask"].tolist() == [[1.0]]
        rewards.append(item["rewards"].item())
    assert rewards == [0.0, 10.0, 20.0]


def test_reward_windows_mark_rewards_strictly_beyond_the_threshold_in_float32():
    adder = RewardWindowAdder(2, (1,), np.float32, threshold=0.5, table="rewards")
    items = None
    for t in range(3):
        s = step(t)
        s.rewards = np.array([0.5, -0.75], np.float64) if t == 2 else s.rewards * 0
        out = adder.add(s)
        items = out if out is not None else items
    assert dtypes(items)["reward"] == "float32"
    marks = adder.priorities(items, policy=None)
    assert marks.dtype == np.float32 and marks.tolist() == [0.0, 1.0]


@pytest.mark.parametrize("obs_dtype", [np.uint8, np.float32])
def test_nstep_items_keep_the_observations_dtype(obs_dtype):
    adder = NStepAdder(2, 1, 0.9)
    s = step(0)
    item = adder.record(
        s.obs.astype(obs_dtype),
        s.actions,
        s.rewards,
        s.ends,
        s.truncated,
        s.final_obs.astype(obs_dtype),
    )
    assert item["obs"].dtype == item["next_obs"].dtype == obs_dtype
