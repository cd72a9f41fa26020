"""ppo and impala learn a small continuous task with their Gaussian policy and both normalizers
on, in one process with the services' own parts: the builder's policy acts on a vector env (the
actor's loop, without the wire), its adder makes the unrolls, its learning trains on them and
publishes the parameters (normalizer statistics included) that the policy acts with next.

The task (registered here): reach a target. Each step shows a point x in [-1, 1]^2 and pays
-||a - 0.8 x||^2 for the action a in [-1, 1]^2; episodes end at 10 steps (a time limit: the
truncated steps' bootstrap is used). Its observations are offset and scaled far from the unit
box. The untrained greedy policy plays about 0 and scores about -4.3 an episode (10 x 0.64 x 2/3);
one that reaches every target, 0."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from apexrl import algorithms
from apexrl.algorithms.base import Step
from apexrl.algorithms.envs import final_observations, make_vector_env
from apexrl.algorithms.evaluation import evaluate
from apexrl.config import LearnerConfig

ENV = "apexrl-tests/ReachTarget-v0"
OFFSET, SCALE = 50.0, 20.0  # what the observation normalizer has to undo


class ReachTarget(gym.Env):
    def __init__(self):
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)

    def observe(self) -> np.ndarray:
        self.target = self.np_random.uniform(-1, 1, 2).astype(np.float32)
        return OFFSET + SCALE * self.target

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.observe(), {}

    def step(self, action):
        reward = -float(np.sum((np.clip(action, -1, 1) - 0.8 * self.target) ** 2))
        return self.observe(), reward, False, False, {}


gym.register(ENV, entry_point=ReachTarget, max_episode_steps=10)


def train(name: str, updates: int, settings: dict, seed: int = 0) -> float:
    """Trains `updates` batches of 8 envs x 16 steps; the greedy policy's mean return after.
    On one torch thread, as a learner of these small networks runs (two spin against each
    other on a loaded machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return trained_return(name, updates, settings, seed)
    finally:
        torch.set_num_threads(threads)


def trained_return(name: str, updates: int, settings: dict, seed: int) -> float:
    torch.manual_seed(seed)
    algo = algorithms.get(name).Settings(
        unroll_length=16,
        entropy_cost=0.0,
        normalize_observations=True,
        normalize_rewards=True,
        **settings,
    )
    config = LearnerConfig(
        algorithm=name,
        env=ENV,
        hidden="32,32",
        gamma=0.9,
        learning_rate=3e-3,
        batch_size=8,
        algo=algo,
    )
    builder = algorithms.make(config)
    policy, learning = builder.policy(), builder.learning(config, torch.device("cpu"))
    envs, obs = make_vector_env(ENV, 8, seed)
    (adder,), rng = builder.adders(8, policy), np.random.default_rng(seed)
    for update in range(updates):
        policy.load(learning.parameters())  # what a learner publishes, statistics included
        items = None
        while items is None:
            actions, extras = policy.step(obs, 1.0, rng)
            assert (np.abs(actions) <= 1.0).all()
            next_obs, rewards, terminated, truncated, infos = envs.step(actions)
            final = final_observations(next_obs, infos)
            step = Step(
                obs,
                actions,
                extras,
                rewards.astype(np.float32),
                terminated,
                truncated,
                next_obs,
                final,
                update,
            )
            items, obs = adder.add(step), next_obs
        batch = {k: torch.from_numpy(v) for k, v in items.items()}
        learning.update(batch, torch.ones(8), update + 1)
    policy.load(learning.parameters())
    return float(evaluate(policy, ENV, 20, seed + 1000).mean())


@pytest.mark.parametrize(
    "name,settings",
    [
        ("ppo", {"epochs": 4, "minibatches": 4}),
        ("impala", {"passes": 8, "gae_lambda": 0.95, "normalize_advantages": True}),
    ],
)
def test_a_gaussian_policy_learns_to_reach_the_targets(name, settings):
    before = train(name, 0, settings)
    after = train(name, 40, settings)
    print(f"{name}: greedy mean return {before:.2f} untrained, {after:.2f} after 40 updates")
    assert before < -3.0 and after > -0.75
