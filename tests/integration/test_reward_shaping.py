"""Reward shaping end to end: an actor (in a thread) stores the shaped rewards in a real replay
while its metrics, and an evaluator with the same settings, report the env's own returns."""

import threading

import gymnasium as gym
import numpy as np
import prometheus_client
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

from apexrl import algorithms
from apexrl.actor import loop as actor
from apexrl.algorithms.networks import state_to_numpy
from apexrl.common.parameters import ParameterStore
from apexrl.config import ActorConfig, EvaluatorConfig, LearnerConfig
from apexrl.evaluator import loop as evaluator
from apexrl.replay.client import ReplayClient
from tests.conftest import serve_learner, wait_for

# CartPole cut at 10 steps: episodes that terminate and (most) episodes that are truncated.
ENV = "apexrl-test/CartPole10-v0"
gym.register(ENV, entry_point=CartPoleEnv, max_episode_steps=10)
GAMMA = 0.9
SHAPING = dict(gamma=GAMMA, termination_reward=-20.0, reward_scale=0.5, reward_offset=3.0,
               reward_potential=f"{__name__}:upright")  # fmt: skip


def upright(obs: np.ndarray) -> np.ndarray:
    """A potential: higher the nearer the pole is to upright."""
    return -10.0 * np.abs(obs[:, 2])


def test_actors_learn_shaped_rewards_and_every_return_reported_is_the_envs(tmp_path, replay):
    config = LearnerConfig(env=ENV, checkpoint_dir=str(tmp_path / "ckpt"))
    arrays = state_to_numpy(algorithms.make(config).network())
    store = ParameterStore(history_bytes=0)
    store.publish(arrays, update_step=0)
    one_step = algorithms.get("dqn").Settings(n_step=1)  # an item's reward: one learnt reward
    stop = threading.Event()
    with serve_learner(tmp_path, store, arrays, config) as (address, _):
        acting = ActorConfig(env=ENV, replay=replay.address, learner=address, num_envs=2,
                             insert_batch=16, seed=3, algo=one_step, **SHAPING)  # fmt: skip
        judging = EvaluatorConfig(env=ENV, learner=address, episodes=3, confirm_episodes=0,
                                  seed=11, interval=0.0, **SHAPING)  # fmt: skip
        actor_metrics, evaluator_metrics = (prometheus_client.CollectorRegistry() for _ in "ae")
        threads = [
            threading.Thread(target=actor.run, args=(acting, actor_metrics, stop)),
            threading.Thread(target=evaluator.run, args=(judging, evaluator_metrics, stop)),
        ]
        for thread in threads:
            thread.start()
        try:
            wait_for(lambda: evaluator_metrics.get_sample_value("apexrl_evaluation_rounds_total"),
                     30, "an evaluation")  # fmt: skip
            with ReplayClient(replay.address) as client:
                wait_for(lambda: client.info().size >= 300, 30, "300 items in replay")
                columns = client.sample(1024).columns
        finally:
            stop.set()
            for thread in threads:
                thread.join(10)
    # Stored: ((1 - 20 where the pole fell) + gamma * phi(s') - phi(s)) * 0.5 + 3, phi(s') = 0
    # where it fell (discount 0); s' of a truncated step is its last observation (next_obs).
    ended = columns["discount"] == 0
    assert ended.any() and (~ended).any()
    after = np.where(ended, 0.0, upright(columns["next_obs"]))
    env_reward = np.where(ended, 1.0 - 20.0, 1.0)
    expected = (env_reward + GAMMA * after - upright(columns["obs"])) * 0.5 + 3.0
    np.testing.assert_allclose(columns["reward"], expected, rtol=1e-5)
    # The actor's reported returns are its episodes' lengths: CartPole's 1 a step.
    returns = actor_metrics.get_sample_value("apexrl_actor_episode_return_sum")
    assert returns > 0
    assert returns == actor_metrics.get_sample_value("apexrl_actor_episode_length_sum")
    # The evaluator scores the env's return: its episodes (seeds 11, 12, 13) played here.
    policy = algorithms.make(LearnerConfig(env=ENV)).policy()
    policy.load(arrays)
    unshaped = np.mean([played(policy, seed) for seed in (11, 12, 13)])
    assert evaluator_metrics.get_sample_value("apexrl_evaluation_mean_return") == unshaped


def played(policy, seed: int) -> float:
    """The env's return of one greedy episode."""
    env = gym.make(ENV)
    obs, _ = env.reset(seed=seed)
    total, done = 0.0, False
    while not done:
        action = policy.act(obs[None], 0.0, np.random.default_rng(0))[0]
        obs, reward, terminated, truncated, _ = env.step(action)
        total, done = total + float(reward), terminated or truncated
    env.close()
    return total
