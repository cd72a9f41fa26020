"""Overlapping sequences from a gymnasium vector env, for recurrent learners (R2D2's items).

Each env's stream is cut into sequences of `length` steps that start every `period` steps of
an episode (period < length: neighbours overlap by length - period steps), never crossing an
episode end. An item (the columns `sequence_columns` declares, time first):

    observations [length + 1, *obs]  the observation each step acted on, then the one after
                                     the last real step (the final one where the episode ended)
    actions, rewards [length]
    discounts [length]               gamma, 0 after a terminal step and on padding
    mask [length]                    1 on real steps, 0 on padding
    state [state_size]               the policy's recurrent state before the first step
    exploration [], version []       the behaviour policy's parameter and the version that acted,
                                     both at the first step

A full sequence goes out as soon as its last step is taken. At an episode end (terminal, a lost
life the actor counts as one, or a time limit) one more goes out, as Acme's sequence adder does:
the oldest sequence still open, its tail padded with zeros and masked, unless the full sequence
emitted at that very step already ends there. The sequences started after it lie inside it and
are dropped.

Where the recurrent state comes from: `Policy.step` returns it in its extras as "state" (float32
[num_envs, state_size]) with "exploration" (float32 [num_envs]); the adder keeps each step's, so
every sequence carries the state its first step was acted from.

A policy that also returns the Q-values it acted on, "q" (float32 [num_envs, actions]), and the
state after the step, "next_state", gets two more fields in each item for its initial
priorities, which replay does not store (`acting_fields`): "acting_q" [length, actions] (zero
on padding) and "last_state" [state_size], the state after the sequence's last real step, from
which the Q-values of the observation after it are one step away (Ape-X's actors compute
priorities from the values they acted on, not by unrolling every sequence again).
"""

from typing import ClassVar

import numpy as np

from apexrl.algorithms.base import Adder, Step


class SequenceAdder(Adder):
    """Sequences of `length` steps every `period` steps of an episode, one table's items."""

    acting_fields: ClassVar[tuple[str, ...]] = ("acting_q", "last_state")

    def __init__(
        self,
        num_envs: int,
        length: int,
        period: int,
        obs_shape,
        obs_dtype,
        state_size: int,
        gamma: float,
        table: str = "default",
    ):
        check_sequence(length, period)
        if num_envs < 1:
            raise ValueError(f"num_envs: must be >= 1, got {num_envs}")
        self.table, self.length, self.period, self.gamma = table, length, period, gamma
        self.state_size = state_size
        shape = (num_envs, length)
        # A ring of each env's last `length` steps of its episode; slot = episode step % length.
        self.obs = np.zeros((*shape, *obs_shape), obs_dtype)
        self.actions = np.zeros(shape, np.int64)
        self.rewards = np.zeros(shape, np.float32)
        self.discounts = np.zeros(shape, np.float32)
        self.states = np.zeros((*shape, state_size), np.float32)
        self.exploration = np.zeros(shape, np.float32)
        self.versions = np.zeros(shape, np.int64)
        self.steps = np.zeros(num_envs, np.int64)  # steps taken in each env's episode
        self.q: np.ndarray | None = None  # [*shape, actions] once a policy gives "q"

    def add(self, step: Step) -> dict[str, np.ndarray] | None:
        state = np.asarray(step.extras["state"], np.float32)
        n = len(self.steps)
        if state.shape != (n, self.state_size):
            raise ValueError(
                f"state: the policy's recurrent state must be [{n}, {self.state_size}] (num_envs,"
                f" state_size), got {list(state.shape)}"
            )
        rows, slot = np.arange(n), self.steps % self.length
        self.obs[rows, slot] = step.obs
        self.actions[rows, slot] = step.actions
        self.rewards[rows, slot] = step.rewards
        self.discounts[rows, slot] = np.where(step.ends, 0.0, self.gamma)
        self.states[rows, slot] = state
        self.exploration[rows, slot] = step.extras["exploration"]
        self.versions[rows, slot] = step.version
        acting = "q" in step.extras
        if acting:
            q = np.asarray(step.extras["q"], np.float32)
            if self.q is None or self.q.shape[2:] != q.shape[1:]:
                self.q = np.zeros((n, self.length, *q.shape[1:]), np.float32)
            self.q[rows, slot] = q
        self.steps += 1
        since_full = self.steps - self.length
        full = (since_full >= 0) & (since_full % self.period == 0)
        ended = np.asarray(step.ends) | np.asarray(step.truncated)
        # The oldest open sequence starts at the first period multiple after steps - length.
        open_start = np.maximum(0, (since_full // self.period + 1) * self.period)
        tail = ended & ~full
        starts = [(i, self.steps[i] - self.length) for i in np.flatnonzero(full).tolist()]
        starts += [(i, open_start[i]) for i in np.flatnonzero(tail).tolist()]
        items = [self.sequence(i, start, step.final_obs[i]) for i, start in starts]
        if acting:  # the state after this step: after each item's last real step
            for (i, _), item in zip(starts, items, strict=True):
                item["last_state"] = np.asarray(step.extras["next_state"][i], np.float32)
        self.steps[ended] = 0
        if not items:
            return None
        return {name: np.stack([item[name] for item in items]) for name in items[0]}

    def sequence(self, env: int, start: int, last_obs: np.ndarray) -> dict[str, np.ndarray]:
        """Env `env`'s steps from episode step `start` to the last one taken, padded to length;
        `last_obs` is the observation after that last step."""
        real = int(self.steps[env] - start)
        order = np.arange(start, start + real) % self.length
        obs = np.zeros((self.length + 1, *self.obs.shape[2:]), self.obs.dtype)
        obs[:real], obs[real] = self.obs[env, order], last_obs
        pad = self.length - real

        def padded(ring: np.ndarray) -> np.ndarray:
            return np.concatenate([ring[env, order], np.zeros((pad, *ring.shape[2:]), ring.dtype)])

        first = order[0]
        acting = {} if self.q is None else {"acting_q": padded(self.q)}
        return acting | {
            "observations": obs,
            "actions": padded(self.actions),
            "rewards": padded(self.rewards),
            "discounts": padded(self.discounts),
            "mask": (np.arange(self.length) < real).astype(np.float32),
            "state": self.states[env, first].copy(),
            "exploration": self.exploration[env, first],
            "version": self.versions[env, first],
        }


def check_sequence(length: int, period: int, burn_in: int = 0) -> None:
    """Refuses sequence settings that cannot work (ValueError naming the setting)."""
    if length < 1:
        raise ValueError(f"sequence_length: must be >= 1, got {length}")
    if not 1 <= period <= length:
        raise ValueError(
            f"sequence_period: must be 1 to sequence_length ({length}), got {period} (a larger"
            " period would leave steps out of every sequence)"
        )
    if not 0 <= burn_in < length:
        raise ValueError(
            f"burn_in: must be 0 to sequence_length - 1 ({length - 1}), got {burn_in} (the"
            " learner would have no step left to learn from)"
        )
