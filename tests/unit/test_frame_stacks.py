"""Frame stacks stored once per step: split and rebuild are exact across episode starts (as
gymnasium's FrameStackObservation pads them), and a Pong unroll rests compressed in replay."""

import gymnasium as gym
import numpy as np
import pytest

from apexrl import algorithms
from apexrl.algorithms import frame_stacks
from apexrl.algorithms.adders.unroll import UnrollAdder
from apexrl.algorithms.columns import pack, unpack
from apexrl.algorithms.envs import make_vector_env
from apexrl.config import LearnerConfig
from apexrl.replay.signature import parse_signature
from apexrl.replay.table import Table


class ShortEpisodes(gym.Env):
    """Random 5x5 frames, episodes of 1 to 4 steps: many starts inside any run of stacks."""

    observation_space = gym.spaces.Box(0, 255, (5, 5), np.uint8)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.left = int(self.np_random.integers(1, 5))
        return self.frame(), {}

    def step(self, action):
        self.left -= 1
        return self.frame(), 0.0, self.left == 0, False, {}

    def frame(self):
        return self.np_random.integers(0, 256, (5, 5), dtype=np.uint8)


def stacked_observations(steps: int, seed: int) -> np.ndarray:
    """What an actor acts on: FrameStackObservation's stacks, reset as soon as an episode ends."""
    env = gym.wrappers.FrameStackObservation(ShortEpisodes(), 4)
    obs, _ = env.reset(seed=seed)
    out = [obs]
    for _ in range(steps - 1):
        obs, _, terminated, _, _ = env.step(0)
        if terminated:
            obs, _ = env.reset()
        out.append(obs)
    return np.stack(out)


@pytest.mark.parametrize("length", [1, 2, 7, 33])
def test_split_then_rebuild_gives_back_the_stacks_across_episode_starts(length):
    runs = np.stack([stacked_observations(length, seed) for seed in range(6)])
    frames, starts = frame_stacks.split(runs)
    assert frames.shape == (6, length + 3, 5, 5) and starts.shape == (6, length)
    assert length < 7 or starts[:, 1:].any(axis=1).all()  # starts inside every longer run
    np.testing.assert_array_equal(frame_stacks.rebuild(frames, starts, 4), runs)


def test_a_start_whose_stack_is_not_padded_with_its_first_frame_is_refused():
    runs = stacked_observations(9, seed=3)[None].copy()
    runs[0, 5] = np.arange(4 * 25, dtype=np.uint8).reshape(4, 5, 5)  # zero-padded, say
    with pytest.raises(ValueError, match="item 0, step 5 starts an episode"):
        frame_stacks.split(runs)


def test_a_pong_unroll_rests_in_replay_compressed_and_comes_back_exact():
    pytest.importorskip("ale_py")
    settings = algorithms.get("impala").Settings(unroll_length=32)
    config = LearnerConfig(algorithm="impala", env="ALE/Pong-v5", algo=settings)
    builder = algorithms.make(config)
    columns = builder.columns()
    (table,) = builder.tables()
    envs, obs = make_vector_env("ALE/Pong-v5", 2, seed=1)
    adder = UnrollAdder(2, 32, obs.shape[1:], obs.dtype)
    rng = np.random.default_rng(0)
    items = None
    while items is None:
        actions = rng.integers(0, envs.single_action_space.n, 2)
        next_obs, rewards, terminated, truncated, _ = envs.step(actions)
        items = adder.record(obs, actions, np.zeros(2), rewards, 1.0 - terminated, next_obs, 1)
        obs = next_obs
    envs.close()
    replay = Table("unrolls", 4, signature=parse_signature(table.signature), seed=0)
    replay.insert(pack(items, columns))
    per_unroll = replay.stored_bytes / 2
    print(f"a Pong unroll of 32 steps rests in {per_unroll:,.0f} B of replay memory")
    assert per_unroll <= 16_000
    sampled = replay.sample(2, 0.0)
    out, ok = unpack(sampled.columns, columns)
    assert ok.all()
    order = sampled.keys
    for name, value in items.items():
        np.testing.assert_array_equal(out[name], value[order], err_msg=name)
