"""dqn's initial priorities from the Q-values its actor acted on: the n-step adder keeps each
transition's acting_q, and the priority from it and one pass over next_obs equals the
learner's |TD error| with the actor's network as online and target."""

import numpy as np
import torch

from apexrl import algorithms
from apexrl.algorithms.adders.nstep import NStepAdder
from apexrl.algorithms.base import Step
from apexrl.algorithms.dqn.acting import DQNPolicy
from apexrl.algorithms.envs import final_observations, make_vector_env
from apexrl.config import ActorConfig

ENVS = 4


def played(policy, steps: int, exploration: float) -> list[dict[str, np.ndarray]]:
    """Transitions of CartPole-v1 (episodes end within the steps) acted by `policy`."""
    envs, obs = make_vector_env("CartPole-v1", ENVS, seed=3)
    adder, rng, items = NStepAdder(ENVS, 3, 0.99), np.random.default_rng(0), []
    for _ in range(steps):
        actions, extras = policy.step(obs, exploration, rng)
        next_obs, rewards, terminated, truncated, infos = envs.step(actions)
        final = final_observations(next_obs, infos)
        step = Step(obs, actions, extras, rewards, terminated, truncated, next_obs, final, 1)
        item = adder.add(step)
        if item is not None:
            items.append(item)
        obs = next_obs
    envs.close()
    return items


def batch_of(items: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {name: np.concatenate([item[name] for item in items]) for name in items[0]}


def dqn_policy(**settings) -> DQNPolicy:
    """The torch policy (the one a CNN acts with; an MLP's acts in numpy) on CartPole-v1."""
    torch.manual_seed(0)
    builder = algorithms.make(ActorConfig(env="CartPole-v1", **settings))
    return DQNPolicy(builder.network())


def test_priorities_from_the_acted_q_values_equal_the_losss():
    policy = dqn_policy()
    batch = batch_of(played(policy, 60, exploration=0.5))
    assert (batch["discount"] == 0).any() and (batch["discount"] > 0).any()
    with torch.no_grad():
        q = policy.net(torch.from_numpy(batch["obs"])).numpy()
    # The Q-value of the action taken, random ones included (exploration 0.5).
    np.testing.assert_allclose(
        batch["acting_q"], q[np.arange(len(q)), batch["action"]], rtol=1e-5, atol=1e-6
    )
    without = {name: column for name, column in batch.items() if name != "acting_q"}
    inputs: list[torch.Tensor] = []
    hook = policy.net.register_forward_hook(lambda module, args, out: inputs.append(args[0]))
    with_acting_q = policy.priorities(batch)
    hook.remove()
    np.testing.assert_allclose(with_acting_q, policy.priorities(without), rtol=1e-5, atol=1e-6)
    assert with_acting_q.min() >= 0
    assert with_acting_q.dtype == policy.priorities(without).dtype == np.float32
    # The saving: one pass of the network, over next_obs (the loss makes three).
    assert len(inputs) == 1
    np.testing.assert_array_equal(inputs[0].numpy(), batch["next_obs"])


def test_the_acting_q_is_left_out_of_what_replay_stores():
    policy = dqn_policy()
    item = played(policy, 10, exploration=0.0)[0]
    stored = {column.name for column in algorithms.transition_columns(ActorConfig())}
    assert "acting_q" in item and "acting_q" not in stored
    assert NStepAdder.acting_fields == ("acting_q",)


def test_c51_acts_without_acting_q():
    """C51's priorities are KL losses: its transitions keep the loss's path."""
    policy = dqn_policy(algorithm="rainbow")
    assert policy.net.support is not None
    assert "acting_q" not in played(policy, 10, exploration=0.0)[0]
