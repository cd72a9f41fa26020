"""Whole episodes from a gymnasium vector env, for Monte Carlo policy gradients (REINFORCE).

Each env's episode becomes one item when it ends. Items have a fixed size (the replay's
columns do), `max_steps` steps, padded with zeros and masked (the columns
`episode_columns` declares, time first):

    observations [max_steps + 1, *obs]  the observation each step acted on, then the one after
                                        the last real step (the final one where it ended)
    actions, rewards [max_steps]
    discounts [max_steps]               gamma; 0 after a terminal step and on padding
    mask [max_steps]                    1 on real steps, 0 on padding
    version []                          the parameter version that acted the first step

A time limit is not a terminal state: the last step of a truncated episode keeps its discount
gamma, and the observation after it is there for a learner that bootstraps from it.

An episode longer than `max_steps` is cut there: the first `max_steps` steps go out as an
item that ends as a truncated one does (discount gamma, the observation after the cut), and
the steps after the cut start the env's next item, which ends where the episode ends (or at
the next cut). Nothing is dropped; each item's returns are its own steps' plus whatever the
learner bootstraps at its end.

An item is labelled with the version of its first step. An actor may take new parameters in
the middle of an episode (another env's episode ended: the adder is always at a boundary), so
an item is one version's only if no newer one arrived before it ended: such an item carries
an older version than the learner's newest, which an on-policy learner drops and counts
(datasets.FreshQueue).
"""

import numpy as np

from apexrl.algorithms.base import Adder, Step
from apexrl.algorithms.columns import Column
from apexrl.algorithms.envs import EnvSpec


def episode_columns(spec: EnvSpec, max_steps: int, algorithm: str) -> list[Column]:
    """The columns of an EpisodeAdder's items (the module's docstring); Discrete actions only."""
    if max_steps < 1:
        raise ValueError(f"max_episode_steps: must be >= 1, got {max_steps}")
    if not spec.discrete:
        raise ValueError(
            f"algorithm: {algorithm} acts in Discrete action spaces; {spec.env_id} has a"
            " continuous one (use dpg, or ppo or impala with a Gaussian policy)"
        )
    f32 = np.dtype(np.float32)
    return [
        Column("observations", np.dtype(spec.obs_dtype), (max_steps + 1, *spec.obs_shape)),
        Column("actions", np.dtype(np.int64), (max_steps,)),
        Column("rewards", f32, (max_steps,)),
        Column("discounts", f32, (max_steps,)),
        Column("mask", f32, (max_steps,)),
        Column("version", np.dtype(np.int64), ()),
    ]


class EpisodeAdder(Adder):
    """Each env's episodes (cut every `max_steps` steps), inserted as soon as they end."""

    insert_at_once = True

    def __init__(
        self, num_envs: int, max_steps: int, obs_shape, obs_dtype, gamma: float, table="default"
    ):
        if num_envs < 1:
            raise ValueError(f"num_envs: must be >= 1, got {num_envs}")
        if max_steps < 1:
            raise ValueError(f"max_episode_steps: must be >= 1, got {max_steps}")
        self.table, self.max_steps, self.gamma = table, max_steps, gamma
        shape = (num_envs, max_steps)
        self.obs = np.zeros((num_envs, max_steps + 1, *obs_shape), obs_dtype)
        self.actions = np.zeros(shape, np.int64)
        self.rewards = np.zeros(shape, np.float32)
        self.discounts = np.zeros(shape, np.float32)
        self.versions = np.zeros(num_envs, np.int64)
        self.steps = np.zeros(num_envs, np.int64)  # steps in each env's open item

    def add(self, step: Step) -> dict[str, np.ndarray] | None:
        rows, t = np.arange(len(self.steps)), self.steps
        self.versions[t == 0] = step.version
        self.obs[rows, t] = step.obs
        self.actions[rows, t] = step.actions
        self.rewards[rows, t] = step.rewards
        self.discounts[rows, t] = np.where(step.ends, 0.0, self.gamma)
        self.steps += 1
        done = np.asarray(step.ends) | np.asarray(step.truncated) | (self.steps == self.max_steps)
        if not done.any():
            return None
        envs = np.flatnonzero(done)
        lengths = self.steps[envs]
        self.obs[envs, lengths] = step.final_obs[envs]
        real = np.arange(self.max_steps) < lengths[:, None]  # [items, max_steps]
        observations = self.obs[envs]
        observations[np.arange(self.max_steps + 1) > lengths[:, None]] = 0
        items = {
            "observations": observations,
            "actions": np.where(real, self.actions[envs], 0),
            "rewards": np.where(real, self.rewards[envs], 0).astype(np.float32),
            "discounts": np.where(real, self.discounts[envs], 0).astype(np.float32),
            "mask": real.astype(np.float32),
            "version": self.versions[envs].copy(),
        }
        self.steps[envs] = 0
        return items
