"""Ape-X DQN's policy: epsilon-greedy on Q, or noisy heads."""

import numpy as np
import torch

from apexrl.algorithms.base import Policy
from apexrl.algorithms.dqn.losses import loss_of
from apexrl.algorithms.dqn.networks import QNetwork, set_noise
from apexrl.algorithms.exploration import epsilon_greedy
from apexrl.algorithms.networks import load_numpy_state


class DQNPolicy(Policy):
    """Epsilon-greedy on Q; with noisy heads, an actor's step acts on a new noise sample each
    step, while `act` (the evaluator, `apexrl eval`) uses the mean weights: no noise.

    An actor's step also gives the Q-value of each action it took (extras "acting_q"), which
    the n-step adder keeps with each transition; the initial priority of an expected-Q
    network's transition then needs one pass over next_obs instead of three over obs and
    next_obs (the loss's online(obs), online(next_obs) and target(next_obs))."""

    def __init__(self, net: QNetwork):
        self.net = net
        self.loss = loss_of(net)

    def load(self, arrays: dict[str, np.ndarray]) -> None:
        load_numpy_state(self.net, arrays)

    def act(self, obs: np.ndarray, exploration: float, rng: np.random.Generator) -> np.ndarray:
        """Epsilon-greedy: a uniformly random action with probability `exploration`."""
        set_noise(self.net, 0.0)
        return self._epsilon_greedy(obs, exploration, rng)[0]

    def step(self, obs, exploration, rng):
        set_noise(self.net, 1.0)
        actions, q = self._epsilon_greedy(obs, exploration, rng)
        if self.net.support is not None:  # C51's priorities are KL losses, not TD errors
            return actions, {}
        return actions, {"acting_q": q[np.arange(len(q)), actions].astype(np.float32)}

    def _epsilon_greedy(self, obs, exploration, rng) -> tuple[np.ndarray, np.ndarray]:
        """The actions and the Q-values [B, A] they were chosen on."""
        with torch.no_grad():
            q = self.net(torch.from_numpy(obs)).numpy()
        return epsilon_greedy(q.argmax(1), exploration, self.net.num_actions, rng), q

    def priorities(self, columns: dict[str, np.ndarray]) -> np.ndarray:
        """The learner's priority (|TD error| or the KL loss) with the actor's own network as
        both online and target, as in Ape-X. With the Q-values acted on ("acting_q"), the
        same |TD error| from one pass over next_obs: double DQN's target with one network as
        both is the max of its Q-values."""
        if "acting_q" in columns:
            with torch.no_grad():
                next_q = self.net(torch.from_numpy(columns["next_obs"])).max(1).values.numpy()
            target = columns["reward"] + columns["discount"] * next_q
            return np.abs(target - columns["acting_q"]).astype(np.float32)
        batch = {name: torch.from_numpy(array) for name, array in columns.items()}
        with torch.no_grad():
            _, priorities, _ = self.loss(
                self.net, self.net, batch, torch.ones(len(columns["action"]))
            )
        return priorities.numpy().astype(np.float32)
