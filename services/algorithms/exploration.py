"""Per-actor exploration ladders: the place i of n live actors -> its exploration parameter.

The learner hands each actor its place with its lease (protos/apexrl/v1/learner.proto); the
ladder re-spreads when actors come or go.
"""

import numpy as np


def epsilon_ladder(i: int, n: int, base: float = 0.4, alpha: float = 7.0) -> float:
    """Epsilon of actor i of n: base ** (1 + alpha * i / (n - 1)); a lone actor gets base.

    With the defaults actor 0 explores with 0.4 and actor n-1 with 0.4 ** 8.
    """
    if n < 1:
        raise ValueError(f"n (number of actors) must be >= 1, got {n}")
    if not 0 <= i < n:
        raise ValueError(f"i (actor index) must be in [0, n) = [0, {n}), got {i}")
    if n == 1:
        return base
    return base ** (1.0 + alpha * i / (n - 1))


def noise_ladder(i: int, n: int, high: float = 0.5, low: float = 0.05) -> float:
    """Gaussian action-noise scale of actor i of n (std as a fraction of the action half-range):
    geometric from `high` (actor 0) to `low` (actor n-1); a lone actor gets `high` ** 0.5 *
    `low` ** 0.5, the ladder's geometric middle, so one actor neither flails nor stops exploring.

    The epsilon ladder's shape (geometric in i), over the range DDPG-style noise is used in:
    TD3 and SB3 use 0.1, Ape-X DPG spreads its actors over a range of scales.
    """
    if n < 1:
        raise ValueError(f"n (number of actors) must be >= 1, got {n}")
    if not 0 <= i < n:
        raise ValueError(f"i (actor index) must be in [0, n) = [0, {n}), got {i}")
    if n == 1:
        return (high * low) ** 0.5
    return high * (low / high) ** (i / (n - 1))


def epsilon_greedy(
    greedy: np.ndarray, epsilon: float, num_actions: int, rng: np.random.Generator
) -> np.ndarray:
    """Each env's greedy action, or with probability epsilon a uniformly random one."""
    if epsilon <= 0:
        return greedy
    explore = rng.random(len(greedy)) < epsilon
    return np.where(explore, rng.integers(num_actions, size=len(greedy)), greedy)
