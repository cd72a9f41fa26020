"""Reward shaping (algorithms/rewards.py) by hand on a tiny deterministic env, stepped as the
actor steps its envs; the settings that cannot work refused by name at start-up."""

import gymnasium as gym
import numpy as np
import pytest

from apexrl import config as cfg
from apexrl.algorithms.envs import final_observations, make_vector_env
from apexrl.algorithms.rewards import RewardShaping


class Chain(gym.Env):
    """Walks 0 -> 1 -> 2 -> 3 whatever the action; reward: the position reached; terminates at 3."""

    observation_space = gym.spaces.Box(0.0, 3.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.position = 0
        return np.array([0.0], np.float32), {}

    def step(self, action):
        self.position += 1
        obs = np.array([self.position], np.float32)
        return obs, float(self.position), self.position == 3, False, {}


gym.register("apexrl-test/Chain-v0", entry_point=Chain)  # terminates on its 3rd step
gym.register("apexrl-test/ShortChain-v0", entry_point=Chain, max_episode_steps=2)  # truncated


def ten_times_position(obs: np.ndarray) -> np.ndarray:
    return 10.0 * obs[:, 0]


def position_once(obs: np.ndarray) -> np.ndarray:
    return obs[:1, 0]  # one number, whatever the batch


NOT_CALLABLE = 3.0
POTENTIAL = f"{__name__}:ten_times_position"


def shaped(env_id: str, steps: int, **settings) -> list[float]:
    """The learnt rewards of an env's steps, as the actor makes them (final observations of the
    episodes that end, terminated flags)."""
    shaping = RewardShaping.of(cfg.AgentConfig(**settings))
    envs, obs = make_vector_env(env_id, 1, seed=0)
    learnt = []
    for _ in range(steps):
        next_obs, rewards, terminated, truncated, infos = envs.step(np.zeros(1, np.int64))
        final_obs = final_observations(next_obs, infos)
        learnt.append(float(shaping(rewards, obs, final_obs, terminated, terminated)[0]))
        obs = next_obs
    envs.close()
    return learnt


def test_defaults_leave_the_env_rewards_as_they_are():
    assert shaped("apexrl-test/Chain-v0", 4) == [1.0, 2.0, 3.0, 1.0]


def test_potential_then_scale_and_offset_with_the_termination_reward():
    """gamma 0.5, phi = 10 x position, x2 + 1, -20 on termination:
    step 1: (1 + 0.5*10 - 0) * 2 + 1 = 13; step 2: (2 + 0.5*20 - 10) * 2 + 1 = 5;
    step 3, terminal, phi(s') = 0: (3 - 20 + 0 - 20) * 2 + 1 = -73; then a new episode."""
    settings = dict(gamma=0.5, reward_potential=POTENTIAL, reward_scale=2.0, reward_offset=1.0,
                    termination_reward=-20.0)  # fmt: skip
    assert shaped("apexrl-test/Chain-v0", 4, **settings) == [13.0, 5.0, -73.0, 13.0]
    # Clipped last.
    clipped = shaped("apexrl-test/Chain-v0", 3, **settings, reward_clip=10.0)
    assert clipped == [10.0, 5.0, -10.0]


def test_a_truncation_keeps_the_potential_of_its_final_observation_and_no_termination_reward():
    """ShortChain is cut after 2 steps: step 2 is shaped as an ordinary one (phi of the final
    observation, 2, not of the next episode's first, 0), without the termination reward."""
    settings = dict(gamma=0.5, reward_potential=POTENTIAL, termination_reward=-20.0)
    assert shaped("apexrl-test/ShortChain-v0", 3, **settings) == [6.0, 2.0, 6.0]


def test_atari_rewards_are_clipped_to_one_before_the_scale():
    shaping = RewardShaping.of(cfg.AgentConfig(reward_scale=2.0), clip_atari=True)
    obs, no = np.zeros((3, 1), np.float32), np.zeros(3, bool)
    assert shaping(np.array([5.0, -3.0, 0.5]), obs, obs, no, no).tolist() == [2.0, -2.0, 1.0]


def test_a_potential_that_returns_the_wrong_shape_is_named():
    shaping = RewardShaping.of(cfg.AgentConfig(reward_potential=f"{__name__}:position_once"))
    obs = np.zeros((2, 1), np.float32)
    with pytest.raises(ValueError, match="^reward_potential: must return 2 finite numbers"):
        shaping(np.ones(2), obs, obs, np.zeros(2, bool), np.zeros(2, bool))


@pytest.mark.parametrize(
    ("name", "bad", "message"),
    [
        ("reward_potential", "apexrl_no_such_module:phi", "cannot be imported"),
        ("reward_potential", f"{__name__}:no_such_function", "cannot be imported"),
        ("reward_potential", f"{__name__}:NOT_CALLABLE", "is a float, not a callable"),
        ("reward_potential", "no_colon", "expected 'package.module:function'"),
        ("reward_clip", -1.0, "must be > 0, or 0 for no clip"),
        ("reward_scale", 0.0, "must be > 0"),
        ("reward_offset", float("nan"), "must be a finite number"),
        ("termination_reward", float("inf"), "must be a finite number"),
    ],
)
def test_settings_that_cannot_work_are_refused_by_name(name, bad, message):
    with pytest.raises(ValueError, match=f"^{name}: .*{message}"):
        cfg.AgentConfig(**{name: bad})


def test_a_service_refuses_them_at_start_up_before_anything_is_made(tmp_path, capsys):
    """The actor's command line: exit 2 with one line naming the setting, nothing written."""
    from apexrl import cli

    ready = tmp_path / "ready.json"
    with pytest.raises(SystemExit) as exited:
        cli.main(["actor", "--reward-potential", "apexrl_no_such_module:phi",
                  "--ready-file", str(ready), "--replay", "127.0.0.1:1"])  # fmt: skip
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("apexrl actor: error: reward_potential: 'apexrl_no_such_module:phi'")
    assert list(tmp_path.iterdir()) == []


def test_local_mode_refuses_them_before_its_run_folder_exists(tmp_path, capsys):
    from apexrl.local.run import main

    run_dir = tmp_path / "run"
    assert main(["--reward-clip", "-1", "--run-dir", str(run_dir)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "apexrl local: error: reward_clip: must be > 0, or 0 for no clip, got -1.0"
    assert not run_dir.exists()
