"""Neural Episodic Control's policy: epsilon-greedy on the DNDs' Q-values."""

import numpy as np
import torch

from apexrl.algorithms.base import Policy
from apexrl.algorithms.exploration import epsilon_greedy
from apexrl.algorithms.nec.networks import NECNetwork
from apexrl.algorithms.networks import load_numpy_state


class NECPolicy(Policy):
    def __init__(self, net: NECNetwork):
        self.net = net

    def load(self, arrays: dict[str, np.ndarray]) -> None:
        load_numpy_state(self.net, arrays)

    def act(self, obs: np.ndarray, exploration: float, rng: np.random.Generator) -> np.ndarray:
        """Epsilon-greedy: a uniformly random action with probability `exploration`."""
        with torch.no_grad():
            greedy = self.net(torch.from_numpy(obs)).argmax(1).numpy()
        return epsilon_greedy(greedy, exploration, self.net.num_actions, rng)

    def priorities(self, columns: dict[str, np.ndarray]) -> np.ndarray:
        """A uniform table: every item's priority is 1."""
        return np.ones(len(columns["action"]), np.float32)
