"""UNREAL's experience: what actors write besides the unrolls (torch-free).

- `ExperienceAdder`: sequences of `length` steps for pixel control and value replay, cut and
  written as unrolls are (adders/unroll.py), to a uniform table; they never hold the actor's
  parameters back (at_boundary always).
- `RewardWindowAdder`: every window of 3 consecutive observations of one episode with the
  reward that followed the last, for reward prediction, to a table whose `balanced` sampler
  draws half its windows from those marked rewarding (|reward| > `threshold`, priority 1).
"""

import numpy as np

from apexrl.algorithms.adders.unroll import UnrollAdder
from apexrl.algorithms.base import Adder, Policy, Step

WINDOW = 3  # observations a reward prediction reads (Jaderberg et al. 2016, section 3.2)


class ExperienceAdder(UnrollAdder):
    """Unrolls by another name and table, taken whatever the actor's parameters."""

    @property
    def at_boundary(self) -> bool:
        return True


class RewardWindowAdder(Adder):
    """Items {"observations": [3, *obs], "reward": []}: the observations of steps t-2, t-1, t
    of one episode and the (clipped) reward of step t."""

    def __init__(self, num_envs: int, obs_shape, obs_dtype, threshold: float, table: str):
        self.table, self.threshold = table, threshold
        self.window = np.zeros((num_envs, WINDOW, *obs_shape), obs_dtype)
        self.seen = np.zeros(num_envs, np.int64)  # observations of the episode in the window

    def add(self, step: Step) -> dict[str, np.ndarray] | None:
        self.window[:, :-1] = self.window[:, 1:]
        self.window[:, -1] = step.obs
        self.seen = np.minimum(self.seen + 1, WINDOW)
        full = np.flatnonzero(self.seen == WINDOW)
        items = None
        if len(full):
            items = {
                "observations": self.window[full].copy(),
                "reward": np.asarray(step.rewards, np.float32)[full],
            }
        self.seen[np.asarray(step.ends) | np.asarray(step.truncated)] = 0  # the env reset
        return items

    def priorities(self, items: dict[str, np.ndarray], policy: Policy) -> np.ndarray:
        """The balanced sampler's mark: 1 where the window ends in a reward, else 0."""
        return (np.abs(items["reward"]) > self.threshold).astype(np.float32)
