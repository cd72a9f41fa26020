"""Neural Episodic Control's network: an embedding and a DND per action."""

from collections.abc import Sequence
from typing import cast

import numpy.typing as npt
import torch
from torch import nn

from apexrl.algorithms.nec.dnd import DND
from apexrl.algorithms.networks import build_torso


class NECNetwork(nn.Module):
    """obs -> embedding h (the torso, then a linear layer to key_size) -> Q(s, a) = DND_a(h)."""

    def __init__(
        self,
        obs_shape: Sequence[int],
        obs_dtype: npt.DTypeLike,
        num_actions: int,
        hidden: Sequence[int],
        key_size: int,
        dnd: dict,
    ):
        super().__init__()
        torso = build_torso(obs_shape, obs_dtype, hidden)
        self.embed = nn.Sequential(torso, nn.Linear(torso.out_dim, key_size))
        self.dnds = nn.ModuleList(DND(key_size=key_size, **dnd) for _ in range(num_actions))
        self.num_actions = num_actions

    @property
    def dictionaries(self) -> list[DND]:
        """The DNDs, one per action, as DNDs (a ModuleList yields plain Modules)."""
        return cast(list[DND], list(self.dnds))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Q [B, num_actions]."""
        h = self.embed(obs)
        return torch.stack([dnd(h) for dnd in self.dnds], dim=1)

    def q_taken(self, h: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """Q(s, action) [B] of embeddings h: each item looks up only its action's DND."""
        q = h.new_zeros(len(h))
        for a, dnd in enumerate(self.dnds):
            rows = (action == a).nonzero().squeeze(1)
            if len(rows):
                q = q.index_put((rows,), dnd(h[rows]))
        return q
