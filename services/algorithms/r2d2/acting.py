"""R2D2's policy: epsilon-greedy on a recurrent Q-network, a state per env."""

import numpy as np
import torch

from apexrl.algorithms.base import Policy
from apexrl.algorithms.exploration import epsilon_greedy
from apexrl.algorithms.networks import load_numpy_state
from apexrl.algorithms.r2d2.losses import priority_mix, td_errors
from apexrl.algorithms.r2d2.networks import RecurrentQNetwork


class R2D2Policy(Policy):
    """Keeps the recurrent state of every env it acts in; an env's state starts at zero with
    each of its episodes."""

    def __init__(self, net: RecurrentQNetwork, settings):
        self.net, self.settings = net, settings
        self.state = np.zeros((0, net.state_size), np.float32)

    def load(self, arrays: dict[str, np.ndarray]) -> None:
        load_numpy_state(self.net, arrays)

    def episode_starts(self, starts: np.ndarray) -> None:
        starts = np.asarray(starts, bool)
        if len(starts) != len(self.state):
            self.state = np.zeros((len(starts), self.net.state_size), np.float32)
        self.state[starts] = 0.0

    def keep_envs(self, envs: np.ndarray) -> None:
        self.state = self.state[np.asarray(envs, np.int64)]

    def step(self, obs, exploration, rng):
        """Epsilon-greedy actions; the extras are the state each env acted from and the
        exploration parameter, which the sequence adder stores, and the Q-values acted on and
        the state after, which it hands to `priorities`."""
        if len(obs) != len(self.state):  # a caller that never said: new envs, at their starts
            self.episode_starts(np.ones(len(obs), bool))
        before = self.state
        with torch.no_grad():
            q, after = self.net.unroll(torch.from_numpy(obs).unsqueeze(1), torch.from_numpy(before))
        self.state = after.numpy()
        q = q[:, 0].numpy()
        actions = epsilon_greedy(q.argmax(1), exploration, self.net.num_actions, rng)
        return actions, {
            "state": before,
            "exploration": np.full(len(obs), exploration, np.float32),
            "q": q,
            "next_state": self.state.copy(),
        }

    def act(self, obs, exploration, rng):
        return self.step(obs, exploration, rng)[0]

    def priorities(self, items: dict[str, np.ndarray]) -> np.ndarray:
        """The learner's priorities with the actor's own network as online and target (Ape-X's
        and R2D2's initial priorities), from the Q-values the actor acted on ("acting_q"): only
        the observation after each sequence's last real step goes through the network, one
        step from "last_state". With the same parameters throughout, these are the Q-values
        the learner's burn-in from the stored state would unroll again."""
        s = self.settings
        real = items["mask"].sum(1).astype(np.int64)
        rows = np.arange(len(real))
        last_obs = torch.from_numpy(items["observations"][rows, real]).unsqueeze(1)
        with torch.no_grad():
            after, _ = self.net.unroll(last_obs, torch.from_numpy(items["last_state"]))
        acting = items["acting_q"]
        q = np.concatenate([acting, np.zeros_like(acting[:, :1])], 1)
        q[rows, real] = after[:, 0].numpy()
        learned = torch.from_numpy(q[:, s.burn_in :])
        batch = {
            name: torch.from_numpy(np.asarray(items[name]))
            for name in ("actions", "rewards", "discounts", "mask")
        }
        td, mask, _ = td_errors(learned, learned, batch, s.burn_in, s.n_step)
        return priority_mix(td, mask, s.priority_eta).numpy().astype(np.float32)
