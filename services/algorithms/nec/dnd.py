"""The differentiable neural dictionary of Neural Episodic Control (Pritzel et al. 2017): one
per action, a fixed number of slots holding keys (embeddings) and values (N-step Q estimates).

- Lookup: the k nearest keys of a query h (squared Euclidean distance d_i), kernel weights
  w_i = 1/(d_i + delta) normalised to sum 1, Q = sum_i w_i v_i. Differentiable in h, in the
  neighbours' keys and in their values: the embedding and the dictionary train end to end.
- Write: a key equal to one held (bit for bit) moves that slot's value toward the new one by
  the tabular rate alpha, v <- v + alpha (v_new - v); any other key takes a free slot or, at
  capacity, the least recently used one (used: written, or among a lookup's neighbours).
- Neighbours are found by faiss's exact search over the live keys (faiss.knn): the keys move
  at every update (writes and gradient steps), and an index kept in step with them costs more
  than the search (docs/algorithms.md has the measurements).

Keys and values are nn.Embedding rows with sparse gradients: an update touches only the
neighbours it looked up, and SparseAdam steps only those rows.
"""

import numpy as np
import torch
from torch import nn


def nearest(queries: np.ndarray, keys: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(squared distances, indices) [B, k] of each query's k nearest keys, nearest first."""
    import faiss

    return faiss.knn(
        np.ascontiguousarray(queries, np.float32), np.ascontiguousarray(keys, np.float32), k
    )


class DND(nn.Module):
    size: torch.Tensor
    last_used: torch.Tensor

    def __init__(
        self,
        capacity: int,
        key_size: int,
        neighbours: int = 50,
        delta: float = 1e-3,
        alpha: float = 0.1,
    ):
        super().__init__()
        if capacity < 1:
            raise ValueError(f"capacity: must be >= 1, got {capacity}")
        if not 1 <= neighbours <= capacity:
            raise ValueError(f"neighbours: must be in [1, capacity = {capacity}], got {neighbours}")
        if delta <= 0:
            raise ValueError(f"delta: must be > 0, got {delta}")
        if not 0 < alpha <= 1:
            raise ValueError(f"alpha: must be in (0, 1], got {alpha}")
        self.capacity, self.neighbours, self.delta, self.alpha = capacity, neighbours, delta, alpha
        self.keys = nn.Embedding(capacity, key_size, sparse=True)
        self.values = nn.Embedding(capacity, 1, sparse=True)
        with torch.no_grad():
            self.keys.weight.zero_()
            self.values.weight.zero_()
        # Float, as every published array is; the slots in use are [0, size).
        self.register_buffer("size", torch.zeros(1))
        # The learner's own bookkeeping, never published: when each slot was last used.
        self.register_buffer(
            "last_used", torch.zeros(capacity, dtype=torch.int64), persistent=False
        )
        self.clock = 0
        self.written_slots: set[int] = set()  # written since the learner last published

    @property
    def used(self) -> int:
        return int(self.size.item())

    def search(self, queries: torch.Tensor) -> np.ndarray:
        """Indices [B, min(k, used)] of each query's nearest keys; marks them used."""
        k = min(self.neighbours, self.used)
        keys = self.keys.weight.detach()[: self.used].cpu().numpy()
        _, indices = nearest(queries.detach().float().cpu().numpy(), keys, k)
        self.clock += 1
        self.last_used[torch.from_numpy(indices.reshape(-1))] = self.clock
        return indices

    def forward(self, queries: torch.Tensor) -> torch.Tensor:
        """Q [B] of embeddings [B, key_size] (0 while the dictionary is empty)."""
        if self.used == 0:
            return queries.sum(dim=1) * 0.0
        indices = torch.from_numpy(self.search(queries)).to(queries.device)
        keys, values = self.keys(indices), self.values(indices).squeeze(2)  # [B, k, ...]
        distances = (queries.float().unsqueeze(1) - keys).pow(2).sum(dim=2)
        weights = 1.0 / (distances + self.delta)
        return (weights * values).sum(dim=1) / weights.sum(dim=1)

    def write(self, keys: np.ndarray, values: np.ndarray) -> dict[str, int]:
        """Writes keys [B, key_size] with values [B], in order; returns how many slots were
        updated in place, appended and replaced."""
        keys = np.ascontiguousarray(keys, np.float32)
        values = np.asarray(values, np.float32)
        matches = self._exact_matches(keys)
        counts = {"updated": 0, "appended": 0, "replaced": 0}
        with torch.no_grad():
            for i, (key, value) in enumerate(zip(keys, values, strict=True)):
                self.clock += 1
                slot = int(matches[i])
                if slot >= 0:
                    old = float(self.values.weight[slot, 0])
                    self.values.weight[slot, 0] = old + self.alpha * (float(value) - old)
                    counts["updated"] += 1
                else:
                    slot = self._free_slot(counts)
                    later = matches[i + 1 :]
                    later[later == slot] = -1  # a key replaced: later copies of it are new
                    self.keys.weight[slot] = torch.from_numpy(key)
                    self.values.weight[slot, 0] = float(value)
                    # Later copies of this key in the batch update the slot it now holds.
                    later[(keys[i + 1 :] == key).all(axis=1)] = slot
                self.last_used[slot] = self.clock
                self.written_slots.add(slot)
        return counts

    def _free_slot(self, counts: dict[str, int]) -> int:
        """The next unused slot, or at capacity the least recently used one."""
        if self.used < self.capacity:
            self.size += 1
            counts["appended"] += 1
            return self.used - 1
        counts["replaced"] += 1
        return int(self.last_used.argmin())

    def _exact_matches(self, keys: np.ndarray) -> np.ndarray:
        """The slot holding each key exactly (bit for bit), or -1."""
        matches = np.full(len(keys), -1, np.int64)
        if self.used == 0:
            return matches
        stored = self.keys.weight.detach()[: self.used].cpu().numpy()
        _, indices = nearest(keys, stored, 1)
        # The nearest key is the one to compare (no distance threshold: the search's rounding
        # grows with the keys' norms); equality of every component decides.
        equal = (stored[indices[:, 0]] == keys).all(axis=1)
        matches[equal] = indices[equal, 0]
        return matches
