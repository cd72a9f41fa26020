"""EnvPool as the actors' Atari backend: it plays envs.make_env's protocol frame for frame and
steps as gymnasium's SAME_STEP SyncVectorEnv does; what it cannot play goes to gymnasium
(auto) or is refused, naming the setting."""

import logging

import numpy as np
import pytest

from apexrl.algorithms import envpool_atari, envs
from apexrl.algorithms.envs import EnvOptions, final_observations, make_vector_env
from apexrl.config import ActorConfig

pytest.importorskip("ale_py")
pytest.importorskip("envpool")


def both(env_id: str, num_envs: int, monkeypatch, **options):
    """The gymnasium and the EnvPool vector envs of env_id, deterministic: sticky actions off
    and one no-op at each start (the only randomness of the protocol then)."""
    monkeypatch.setattr(envs, "NOOP_MAX", 1)
    made = [
        make_vector_env(env_id, num_envs, 0, EnvOptions(atari_backend=b, **options))
        for b in ("gymnasium", "envpool")
    ]
    assert isinstance(made[1][0], envpool_atari.EnvPoolAtari)
    return made


@pytest.mark.parametrize(("env_id", "steps"), [("ALE/Breakout-v5", 260), ("ALE/Pong-v5", 40)])
def test_envpool_steps_as_the_gymnasium_path_frame_for_frame(env_id, steps, monkeypatch):
    """Breakout (lives, FireToStart's FIRE at each start and after each life lost, episodes
    that end) and Pong (no lives: no FIRE) through both backends with the same actions: the
    same observations, rewards, ends and lives at every step; the same final observations at
    an end but for the last frame of a game that ends within the frame skip (gymnasium's
    wrapper keeps the frames before the end, EnvPool shows it)."""
    (gym_envs, gym_obs), (pool, pool_obs) = both(env_id, 2, monkeypatch, sticky_actions=0.0)
    assert pool.single_observation_space == gym_envs.single_observation_space
    assert pool.single_action_space == gym_envs.single_action_space
    assert pool_obs.dtype == np.uint8 and pool_obs.shape == (2, 4, 84, 84)
    np.testing.assert_array_equal(pool_obs, gym_obs)
    rng = np.random.default_rng(0)
    ends, lost, obs, lives = 0, 0, pool_obs, None
    for step in range(steps):
        actions = rng.integers(0, pool.single_action_space.n, 2)
        expected, got = gym_envs.step(actions), pool.step(actions)
        names = ["obs", "reward", "terminated", "truncated"]
        for name, a, b in zip(names, expected[:4], got[:4], strict=True):
            np.testing.assert_array_equal(b, a, err_msg=f"step {step}: {name}")
        assert got[1].dtype == np.float64 and got[2].dtype == bool
        np.testing.assert_array_equal(got[4]["lives"], expected[4]["lives"])
        done = got[2] | got[3]
        if done.any():
            ends += 1
            final, want = final_observations(got[0], got[4]), final_observations(*expected[::4])
            np.testing.assert_array_equal(final[:, :3], want[:, :3])
            np.testing.assert_array_equal(final[~got[2]], want[~got[2]])
            # SAME_STEP, on the data: the old episode goes on in the final obs, the returned
            # obs is a new episode's first frame over the whole stack.
            np.testing.assert_array_equal(final[done, :3], obs[done, 1:])
            assert (got[0][done] == got[0][done][:, :1]).all()
        if lives is not None:
            lost += int(((got[4]["lives"] < lives) & ~done).sum())
        obs, lives = got[0], got[4]["lives"]
    if env_id == "ALE/Breakout-v5":
        assert ends >= 1 and lost >= 3  # lives lost mid-game (FIRE pressed) and episode ends
    pool.close()
    gym_envs.close()


def test_an_episode_cut_by_the_time_limit_is_truncated_and_restarts_in_the_same_step():
    made = envpool_atari.make("ALE/Pong-v5", 3, 5, EnvOptions(), max_episode_steps=4)
    assert made is not None
    pool, obs = made
    for step in range(1, 9):
        next_obs, rewards, terminated, truncated, infos = pool.step(np.zeros(3, np.int64))
        cut = step % 4 == 0
        assert (truncated == cut).all() and not terminated.any()
        if cut:
            assert infos["_final_obs"].all()
            np.testing.assert_array_equal(infos["final_obs"][:, :3], obs[:, 1:])
            assert (next_obs == next_obs[:, :1]).all()  # a first frame, stacked 4 times
        else:
            assert "final_obs" not in infos
            np.testing.assert_array_equal(next_obs[:, :3], obs[:, 1:])
        obs = next_obs
    pool.close()


def test_a_seed_gives_the_same_episodes_and_another_seed_others():
    def play(seed: int) -> np.ndarray:
        pool, obs = make_vector_env("ALE/Pong-v5", 2, seed, EnvOptions(atari_backend="envpool"))
        frames, actions = [obs], np.random.default_rng(0)  # the same actions for every seed
        for _ in range(60):  # no-op starts and sticky actions: the envs' own draws
            frames.append(pool.step(actions.integers(0, 6, 2))[0])
        pool.close()
        return np.stack(frames)

    first = play(7)
    np.testing.assert_array_equal(play(7), first)
    assert not np.array_equal(play(8), first)


def test_full_action_space_gives_the_18_actions():
    pool, _ = make_vector_env(
        "ALE/Pong-v5", 1, 0, EnvOptions(full_action_space=True, atari_backend="envpool")
    )
    assert pool.single_action_space.n == 18
    pool.close()


# ALE's TicTacToe3D-v5 is no EnvPool env (EnvPool spells it TicTacToe3d-v5).
MISSING = "ALE/TicTacToe3D-v5"


def test_a_game_envpool_lacks_goes_to_gymnasium_with_one_log_line_or_is_refused(caplog):
    with caplog.at_level(logging.INFO, logger=envpool_atari.__name__):
        gym_envs, _ = make_vector_env(MISSING, 1, 0, EnvOptions(atari_backend="auto"))
    assert not isinstance(gym_envs, envpool_atari.EnvPoolAtari)
    gym_envs.close()
    (record,) = caplog.records
    assert "EnvPool has no env 'TicTacToe3D-v5'" in record.getMessage()
    with pytest.raises(ValueError, match="atari_backend 'envpool': EnvPool has no env"):
        make_vector_env(MISSING, 1, 0, EnvOptions(atari_backend="envpool"))


def test_without_envpool_auto_plays_gymnasium_and_envpool_is_refused(monkeypatch, caplog):
    monkeypatch.setitem(__import__("sys").modules, "envpool", None)  # import envpool fails
    with caplog.at_level(logging.INFO, logger=envpool_atari.__name__):
        gym_envs, _ = make_vector_env("ALE/Pong-v5", 1, 0)
    assert not isinstance(gym_envs, envpool_atari.EnvPoolAtari)
    gym_envs.close()
    assert "EnvPool is not installed" in caplog.text
    with pytest.raises(ValueError, match="atari_backend 'envpool': EnvPool is not installed"):
        make_vector_env("ALE/Pong-v5", 1, 0, EnvOptions(atari_backend="envpool"))


def test_a_setting_envpool_does_not_honour_is_named(monkeypatch):
    monkeypatch.setattr(envpool_atari, "HONOURED", frozenset({"sticky_actions", "atari_backend"}))
    options = EnvOptions(full_action_space=True, atari_backend="envpool")
    with pytest.raises(ValueError, match="cannot honour full_action_space=True"):
        make_vector_env("ALE/Pong-v5", 1, 0, options)


def test_an_unknown_backend_is_refused_by_name():
    with pytest.raises(ValueError, match="atari_backend: 'fast' is none of auto, gymnasium"):
        EnvOptions.of(ActorConfig(atari_backend="fast"))
    assert EnvOptions.of(ActorConfig(atari_backend="gymnasium")).atari_backend == "gymnasium"
