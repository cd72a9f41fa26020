"""apexrl/Catch-v0, the pixel task: gymnasium's checks, its rules played by hand, a random
policy clearly below a perfect one, and the image path of Atari (the conv torso, compressed
frames) chosen for it."""

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from apexrl.algorithms.columns import compressed_observations
from apexrl.algorithms.envs import env_spec, make_env
from apexrl.algorithms.networks import NatureConvTorso, build_torso
from apexrl.algorithms.pixel_envs import CATCH, COLUMNS, ROWS


def cells(frame: np.ndarray) -> np.ndarray:
    """The 10 x 5 grid a 1 x 40 x 40 frame draws (each cell a block of equal pixels)."""
    assert frame.shape == (1, 40, 40) and frame.dtype == np.uint8
    grid = frame[0, ::4, ::8]
    assert np.array_equal(frame[0], grid.repeat(4, axis=0).repeat(8, axis=1))
    return grid


def play(env: gym.Env, seed: int, policy) -> float:
    obs, _ = env.reset(seed=seed)
    total, done = 0.0, False
    while not done:
        obs, reward, terminated, truncated, _ = env.step(policy(cells(obs)))
        total, done = total + reward, terminated or truncated
    return total


def toward_ball(grid: np.ndarray) -> int:
    """Moves the paddle under the ball (which is above the bottom row whenever one acts)."""
    (ball,) = np.flatnonzero(grid[:-1].any(axis=0))
    (paddle,) = np.flatnonzero(grid[-1])
    return 1 + int(np.sign(ball - paddle))


def test_gymnasium_accepts_it():
    check_env(gym.make(CATCH).unwrapped, skip_render_check=True)


def test_the_ball_falls_a_row_a_step_and_a_catch_scores_only_at_the_bottom():
    env = gym.make(CATCH)
    obs, _ = env.reset(seed=3)
    grid = cells(obs)
    (column,) = np.flatnonzero(grid[0])
    assert np.flatnonzero(grid[-1]).tolist() == [COLUMNS // 2] and grid[1:-1].sum() == 0
    rewards = []
    for row in range(1, ROWS):
        obs, reward, terminated, truncated, _ = env.step(0)  # left, into the wall
        rewards.append(reward)
        assert cells(obs)[row, column] == 255 and terminated == (row == ROWS - 1)
        assert not truncated
    assert rewards[:-1] == [0.0] * (ROWS - 2)
    assert rewards[-1] == (1.0 if column == 0 else -1.0)
    with pytest.raises(ValueError, match="action: expected 0, 1 or 2, got 3"):
        env.step(3)


def test_random_play_loses_where_chasing_the_ball_always_catches():
    env, rng = gym.make(CATCH), np.random.default_rng(0)
    random = [play(env, s, lambda _: int(rng.integers(3))) for s in range(400)]
    chasing = [play(env, s, toward_ball) for s in range(100)]
    assert -0.75 < np.mean(random) < -0.45  # a fifth of the balls caught (-0.60 over 20,000)
    assert chasing == [1.0] * 100
    assert env.spec.reward_threshold == 0.9


def test_it_takes_atari_s_image_path_and_renders_its_frame():
    spec = env_spec(CATCH)
    assert (spec.obs_shape, spec.obs_dtype, spec.num_actions) == ((1, 40, 40), np.uint8, 3)
    assert not spec.vector_obs and not spec.clip_rewards and compressed_observations(spec)
    torso = build_torso(spec.obs_shape, spec.obs_dtype, (64, 64))
    assert isinstance(torso, NatureConvTorso) and torso.out_dim == 512
    env = make_env(CATCH, render_mode="rgb_array")
    obs, _ = env.reset(seed=0)
    assert np.array_equal(env.render(), np.repeat(obs[0][..., None], 3, axis=-1))
