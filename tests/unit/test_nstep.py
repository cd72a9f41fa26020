import numpy as np
import pytest

from apexrl.algorithms.adders.nstep import NStepAdder
from apexrl.algorithms.envs import final_observations, make_vector_env

FINAL = 100.0  # final obs of an episode, distinct from any step index


def run_single_env(adder, rewards, end):
    """Feeds one env: obs at step t is [t]; the last step ends with `end`."""
    out = []
    for t, r in enumerate(rewards):
        last = t == len(rewards) - 1
        next_obs = FINAL if last else t + 1
        batch = adder.record(
            np.array([[t]], np.float32),
            np.array([t % 2]),
            np.array([r]),
            np.array([last and end == "terminated"]),
            np.array([last and end == "truncated"]),
            np.array([[next_obs]], np.float32),
        )
        out.append(batch)
    return out


def test_full_and_terminal_windows_by_hand():
    adder = NStepAdder(num_envs=1, n=3, gamma=0.5)
    out = run_single_env(adder, [1.0, 2.0, 3.0, 4.0, 5.0], end="terminated")
    assert out[0] is None and out[1] is None
    # t=2 completes the window started at 0: 1 + .5*2 + .25*3.
    np.testing.assert_allclose(out[2]["reward"], [2.75])
    np.testing.assert_allclose(out[2]["discount"], [0.125])
    np.testing.assert_array_equal(out[2]["obs"], [[0.0]])
    np.testing.assert_array_equal(out[2]["next_obs"], [[3.0]])
    np.testing.assert_allclose(out[3]["reward"], [2 + 0.5 * 3 + 0.25 * 4])
    # Termination flushes the full window and both partial ones, with discount 0.
    last = out[4]
    np.testing.assert_array_equal(last["obs"][:, 0], [2.0, 3.0, 4.0])
    np.testing.assert_array_equal(last["action"], [0, 1, 0])
    np.testing.assert_allclose(last["reward"], [3 + 0.5 * 4 + 0.25 * 5, 4 + 0.5 * 5, 5])
    np.testing.assert_array_equal(last["discount"], [0.0, 0.0, 0.0])
    np.testing.assert_array_equal(last["next_obs"][:, 0], [FINAL] * 3)
    assert adder.pending() == 0


def test_truncation_keeps_bootstrap_discount():
    adder = NStepAdder(num_envs=1, n=3, gamma=0.5)
    last = run_single_env(adder, [1.0, 2.0, 3.0, 4.0, 5.0], end="truncated")[4]
    np.testing.assert_allclose(last["reward"], [6.25, 6.5, 5.0])
    # gamma^m for m = 3, 2, 1 steps actually in each window.
    np.testing.assert_allclose(last["discount"], [0.125, 0.25, 0.5])
    np.testing.assert_array_equal(last["next_obs"][:, 0], [FINAL] * 3)
    assert last["reward"].dtype == np.float32 and last["discount"].dtype == np.float32
    assert last["action"].dtype == np.int64


def test_episode_shorter_than_n_and_no_leak_into_next_episode():
    adder = NStepAdder(num_envs=1, n=4, gamma=0.9)
    out = run_single_env(adder, [1.0, 1.0], end="terminated")
    np.testing.assert_allclose(out[1]["reward"], [1.9, 1.0])
    np.testing.assert_array_equal(out[1]["discount"], [0.0, 0.0])
    # The next episode starts from clean windows.
    out = run_single_env(adder, [2.0, 2.0, 2.0, 2.0], end="truncated")
    np.testing.assert_allclose(out[3]["reward"][0], 2 * (1 + 0.9 + 0.81 + 0.729), rtol=1e-6)
    np.testing.assert_allclose(out[3]["discount"], [0.9**4, 0.9**3, 0.9**2, 0.9], rtol=1e-6)


def test_n_equals_one_is_plain_one_step():
    adder = NStepAdder(num_envs=2, n=1, gamma=0.99)
    batch = adder.record(
        np.array([[0.0], [1.0]]),
        np.array([1, 0]),
        np.array([0.5, -1.0]),
        np.array([False, True]),
        np.array([False, False]),
        np.array([[10.0], [11.0]]),
    )
    np.testing.assert_allclose(batch["reward"], [0.5, -1.0])
    np.testing.assert_allclose(batch["discount"], [0.99, 0.0])
    np.testing.assert_array_equal(batch["next_obs"][:, 0], [10.0, 11.0])
    np.testing.assert_array_equal(batch["action"], [1, 0])
    assert adder.pending() == 0


def reference_transitions(episodes, n, gamma):
    """Brute force per episode: (env, start, reward, discount, next_obs) sorted by env, start."""
    rows = []
    for env, start_t, rewards, end in episodes:
        length = len(rewards)
        for s in range(length):
            m = min(n, length - s)
            ret = sum(gamma**k * rewards[s + k] for k in range(m))
            ends = s + m == length
            disc = 0.0 if (ends and end == "terminated") else gamma**m
            next_obs = -(env + 1) * 1000.0 - start_t if ends else start_t + s + m
            rows.append((env, start_t + s, ret, disc, next_obs))
    return sorted(rows)


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_two_envs_ending_at_different_times_match_brute_force(n):
    gamma = 0.9
    rng = np.random.default_rng(n)
    # env 0: episodes of length 2 (terminated), 5 (truncated); env 1: 4 (truncated), 3 (terminated).
    plans = [[(2, "terminated"), (5, "truncated")], [(4, "truncated"), (3, "terminated")]]
    num_steps = 7
    rewards = rng.normal(size=(num_steps, 2))
    episodes = []
    ends = np.zeros((num_steps, 2), dtype=object)
    for env, plan in enumerate(plans):
        t = 0
        for length, end in plan:
            episodes.append((env, t, list(rewards[t : t + length, env]), end))
            ends[t + length - 1, env] = (end, t)
            t += length
    adder = NStepAdder(num_envs=2, n=n, gamma=gamma)
    got = []
    for t in range(num_steps):
        # obs = [env, global step], so every window start is identifiable.
        obs = np.array([[0.0, t], [1.0, t]])
        next_obs = np.array([[0.0, t + 1], [1.0, t + 1]])
        term = np.zeros(2, bool)
        trunc = np.zeros(2, bool)
        for env in range(2):
            if ends[t, env]:
                end, start_t = ends[t, env]
                term[env] = end == "terminated"
                trunc[env] = end == "truncated"
                next_obs[env, 1] = -(env + 1) * 1000.0 - start_t  # this episode's final obs
        batch = adder.record(obs, np.zeros(2), rewards[t], term, trunc, next_obs)
        if batch is None:
            continue
        env_start = batch["obs"].astype(int)
        # Rows come env-major, oldest window first.
        assert [tuple(r) for r in env_start] == sorted(tuple(r) for r in env_start)
        np.testing.assert_array_equal(batch["next_obs"][:, 0], env_start[:, 0])
        for k in range(len(env_start)):
            got.append(
                (
                    *env_start[k],
                    float(batch["reward"][k]),
                    float(batch["discount"][k]),
                    float(batch["next_obs"][k, 1]),
                )
            )
    want = reference_transitions(episodes, n, gamma)
    assert adder.pending() == 0
    assert len(got) == len(want) == 2 * num_steps
    for g, w in zip(sorted(got), want, strict=True):
        assert g[:2] == w[:2]
        np.testing.assert_allclose(g[2:], w[2:], rtol=1e-5, atol=1e-6)


def test_rejects_bad_arguments():
    with pytest.raises(ValueError, match="n must"):
        NStepAdder(num_envs=1, n=0, gamma=0.9)
    with pytest.raises(ValueError, match="gamma"):
        NStepAdder(num_envs=1, n=3, gamma=1.5)
    adder = NStepAdder(num_envs=2, n=3, gamma=0.9)
    with pytest.raises(ValueError, match="2 envs"):
        adder.record(
            np.zeros((3, 4)), np.zeros(3), np.zeros(3), *[np.zeros(3, bool)] * 2, np.zeros((3, 4))
        )


def test_cartpole_same_step_autoreset_gives_final_obs():
    envs, obs = make_vector_env("CartPole-v1", num_envs=2, seed=0)
    assert envs.metadata["autoreset_mode"].value == "SameStep"
    adder = NStepAdder(num_envs=2, n=1, gamma=0.99)
    ended = 0
    for _ in range(60):
        actions = envs.action_space.sample()
        next_obs, rewards, terminated, truncated, infos = envs.step(actions)
        batch = adder.record(
            obs, actions, rewards, terminated, truncated, final_observations(next_obs, infos)
        )
        for env in np.flatnonzero(terminated | truncated):
            ended += 1
            # The transition ends in the final obs, not in the new episode's reset obs.
            np.testing.assert_array_equal(batch["next_obs"][env], infos["final_obs"][env])
            assert not np.array_equal(batch["next_obs"][env], next_obs[env])
            assert batch["discount"][env] == (0.0 if terminated[env] else np.float32(0.99))
        not_done = ~(terminated | truncated)
        np.testing.assert_array_equal(batch["next_obs"][not_done], next_obs[not_done])
        obs = next_obs
    envs.close()
    assert ended > 0  # random CartPole episodes last ~20 steps
