"""UNREAL's network: impala's actor-critic with the auxiliary heads on the policy torso's
features (the features the agent acts from are the ones the auxiliary tasks shape; on images
the one conv torso under the policy and the value, as in the paper).

- pixel control (Jaderberg et al. 2016, appendix; as DeepMind's and miyosuda's UNREAL): a
  linear layer to 32x9x9, ReLU, then two transposed convolutions (4x4, stride 2) to 20x20, a
  value map and an advantage map per action; Q = V + A - mean_a A (dueling), [B, actions, 20,
  20], one value per 4x4 cell of the 80x80 centre. The maps are linear: miyosuda's ReLU on them
  can leave the value map dead (0 where its pre-activations went negative, and no gradient),
  and then Q(a) can only spread around 0 while the targets are 0 and 1;
- reward prediction: the features of 3 consecutive observations concatenated, a 128-unit
  ReLU layer, 3 logits (zero, positive, negative reward).
"""

import torch
from torch import nn

from apexrl.algorithms.actor_critic import ActorCriticNetwork
from apexrl.algorithms.unreal.adders import WINDOW

CLASSES = 3  # zero, positive, negative


class PixelControlHead(nn.Module):
    def __init__(self, features: int, num_actions: int):
        super().__init__()
        self.fc = nn.Sequential(nn.Linear(features, 32 * 9 * 9), nn.ReLU())
        self.value = nn.ConvTranspose2d(32, 1, kernel_size=4, stride=2)
        self.advantage = nn.ConvTranspose2d(32, num_actions, kernel_size=4, stride=2)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """Q [B, actions, 20, 20] from features [B, F]."""
        maps = self.fc(features).view(-1, 32, 9, 9)
        value, advantage = self.value(maps), self.advantage(maps)
        return value + advantage - advantage.mean(1, keepdim=True)


class UNREALNetwork(ActorCriticNetwork):
    def __init__(
        self,
        obs_shape,
        obs_dtype,
        num_actions: int,
        hidden,
        *,
        pixel_control: bool,
        reward_prediction: bool,
        **options,
    ):
        """options: ActorCriticNetwork's (a Gaussian policy, the normalizers)."""
        super().__init__(obs_shape, obs_dtype, num_actions, hidden, **options)
        features = self.policy_torso.out_dim
        self.pixel_control = PixelControlHead(features, num_actions) if pixel_control else None
        self.reward_prediction = (
            nn.Sequential(nn.Linear(WINDOW * features, 128), nn.ReLU(), nn.Linear(128, CLASSES))
            if reward_prediction
            else None
        )

    def pixel_q(self, obs: torch.Tensor) -> torch.Tensor:
        """Pixel control's Q [B, actions, 20, 20]."""
        if self.pixel_control is None:
            raise ValueError("pixel_q: this network was built without pixel_control")
        return self.pixel_control(self.policy_torso(self.normalized(obs))).float()

    def reward_logits(self, windows: torch.Tensor) -> torch.Tensor:
        """Logits [B, 3] of the reward after each window of observations [B, 3, *obs]."""
        if self.reward_prediction is None:
            raise ValueError("reward_logits: this network was built without reward_prediction")
        b = windows.shape[0]
        windows = self.normalized(windows.reshape(b * WINDOW, *windows.shape[2:]))
        features = self.policy_torso(windows)
        return self.reward_prediction(features.reshape(b, -1)).float()
