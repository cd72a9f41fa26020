"""R2D2's recurrent Q-network: a torso (an MLP for vectors, the Nature CNN for frames), an LSTM,
then a dueling head. Its state travels as one float32 vector per env, [h, c] concatenated, so
actors can store it in a replay column and the learner can start an unroll from it."""

from collections.abc import Sequence

import numpy.typing as npt
import torch
from torch import nn

from apexrl.algorithms.networks import Torso, build_torso


class RecurrentQNetwork(nn.Module):
    def __init__(self, torso: Torso, num_actions: int, lstm_size: int):
        super().__init__()
        self.torso, self.num_actions, self.lstm_size = torso, num_actions, lstm_size
        self.lstm = nn.LSTM(torso.out_dim, lstm_size, batch_first=True)
        self.value = nn.Linear(lstm_size, 1)
        self.advantage = nn.Linear(lstm_size, num_actions)

    @property
    def state_size(self) -> int:
        return 2 * self.lstm_size

    def unroll(self, obs: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Q-values [B, T, A] of observations [B, T, ...] from state [B, 2 * lstm_size], and the
        state after the last step."""
        batch, steps = obs.shape[:2]
        features = self.torso(obs.reshape(batch * steps, *obs.shape[2:]))
        h, c = state.float().split(self.lstm_size, dim=1)
        out, (h, c) = self.lstm(
            features.reshape(batch, steps, -1),
            (h.unsqueeze(0).contiguous(), c.unsqueeze(0).contiguous()),
        )
        value, advantage = self.value(out), self.advantage(out)
        q = value + advantage - advantage.mean(dim=2, keepdim=True)
        # float32 out of a bfloat16 autocast: h^-1 of the targets cancels digits bfloat16's 8
        # bits do not have (h^-1(-0.8) came out +1 in bfloat16).
        return q.float(), torch.cat([h[0], c[0]], dim=1).float()


def build_network(
    obs_shape: Sequence[int],
    obs_dtype: npt.DTypeLike,
    num_actions: int,
    hidden: Sequence[int],
    lstm_size: int,
) -> RecurrentQNetwork:
    return RecurrentQNetwork(build_torso(obs_shape, obs_dtype, hidden), num_actions, lstm_size)
