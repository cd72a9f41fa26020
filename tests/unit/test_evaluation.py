"""evaluate(): episodes played to their ends, or abandoned (Stopped) once the caller's stop is
set, as a stopping evaluator does with its round."""

import threading

import numpy as np
import pytest

from apexrl.algorithms.base import Policy
from apexrl.algorithms.evaluation import Stopped, evaluate


class Left(Policy):
    """Always action 0; sets `stop` at its `stop_at`-th call."""

    def __init__(self, stop: threading.Event, stop_at: int = 0):
        self.stop, self.stop_at, self.calls = stop, stop_at, 0

    def load(self, arrays):
        pass

    def act(self, obs, exploration, rng):
        self.calls += 1
        if self.calls == self.stop_at:
            self.stop.set()
        return np.zeros(len(obs), np.int64)

    def priorities(self, items):
        return np.ones(len(items["action"]), np.float32)


def test_without_a_stop_every_episode_ends():
    policy = Left(threading.Event())
    returns = evaluate(policy, "CartPole-v1", 3, seed=0, stop=policy.stop)
    assert len(returns) == 3 and (returns > 0).all()


def test_a_stop_set_during_the_round_abandons_it():
    """Pushing left ends CartPole's episodes in about 10 steps: stopped at the 3rd step, the
    round plays no 4th."""
    policy = Left(threading.Event(), stop_at=3)
    with pytest.raises(Stopped, match="3 of 3 episodes running"):
        evaluate(policy, "CartPole-v1", 3, seed=0, stop=policy.stop)
    assert policy.calls == 3
