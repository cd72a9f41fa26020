"""Breakout's FIRE to start: the env presses FIRE at the start and after each life lost, so an
agent that never fires still plays (and loses) its five lives; Pong, without lives, is left as
it is."""

import numpy as np
import pytest

from apexrl.algorithms.envs import EnvOptions, FireToStart, env_spec, make_env

pytest.importorskip("ale_py")


def test_an_agent_that_never_fires_plays_breakouts_five_lives_to_the_end():
    env = make_env("ALE/Breakout-v5", EnvOptions(sticky_actions=0.0))
    try:
        obs, info = env.reset(seed=0)
        assert obs.shape == (4, 84, 84) and info["lives"] == 5
        lives = [info["lives"]]
        for _ in range(5_000):  # NOOP only: the ball is launched by the env alone
            obs, _, terminated, truncated, info = env.step(0)
            if info["lives"] != lives[-1]:
                lives.append(info["lives"])
            if terminated or truncated:
                break
        assert terminated and lives == [5, 4, 3, 2, 1, 0]
    finally:
        env.close()


def test_pong_has_no_lives_and_no_fire_is_pressed():
    env = make_env("ALE/Pong-v5", EnvOptions(sticky_actions=0.0))
    try:
        wrapper = env.env  # FrameStackObservation's inner env
        assert isinstance(wrapper, FireToStart) and wrapper.fires
        env.reset(seed=0)
        assert wrapper.lives == 0
        frames = env.unwrapped.ale.getEpisodeFrameNumber()
        env.step(0)
        assert env.unwrapped.ale.getEpisodeFrameNumber() - frames == 4  # one agent step, no FIRE
    finally:
        env.close()
    assert env_spec("ALE/Breakout-v5").num_actions == 4
    assert np.dtype(env_spec("ALE/Breakout-v5").obs_dtype) == np.uint8
