"""Neural Episodic Control's learning: N-step Q targets written to the DNDs, and the embedding,
keys and values trained end to end on replayed (obs, action, N-step target). Its network is
in networks.py, its policy in acting.py."""

from collections import OrderedDict

import numpy as np
import torch

from apexrl.algorithms.base import Learning, prefixed
from apexrl.algorithms.nec.networks import NECNetwork
from apexrl.algorithms.networks import (
    adam,
    load_numpy_state,
    load_optimizer_state,
    optimizer_state,
    state_to_numpy,
)


def item_ids(batch: dict[str, torch.Tensor]) -> list[int]:
    """An id per item from its obs, action and reward bytes: a transition sampled again has
    the same id."""
    parts = [batch[name].cpu().numpy() for name in ("obs", "action", "reward")]
    rows = [np.ascontiguousarray(p.reshape(len(p), -1)).view(np.uint8) for p in parts]
    return [hash(b"".join(r[i].tobytes() for r in rows)) for i in range(len(rows[0]))]


class NECLearning(Learning):
    """Each update: N-step targets y = reward + discount * max_a Q(next_obs) from the current
    DNDs; Q(obs, action) looked up; the items sampled for the first time written to their
    action's DND (key h(obs), value y); then a gradient step on the squared error
    (y - Q(obs, action)), importance weighted, through the kernel into the embedding and the
    neighbours' keys and values."""

    def __init__(self, build, config, settings, device: torch.device):
        self.config, self.settings, self.device = config, settings, device
        self.net: NECNetwork = build().to(device)
        self.optimizer = adam(self.net.embed.parameters(), config.learning_rate)
        rows = [p for dnd in self.net.dictionaries for p in (dnd.keys.weight, dnd.values.weight)]
        self.dnd_optimizer = torch.optim.SparseAdam(rows, lr=config.learning_rate)
        # Ids of the items already written, oldest first, as many as the replay holds.
        self.written: OrderedDict[int, None] = OrderedDict()
        self.published: dict[str, np.ndarray] | None = None  # the last parameters() answer
        self.refresh_from = 0  # the first DND row of the next version's share

    def update(self, batch, weights, step):
        with torch.no_grad():
            y = batch["reward"] + batch["discount"] * self.net(batch["next_obs"]).max(dim=1).values
        h = self.net.embed(batch["obs"])
        # Looked up before this batch's writes: a key just written would be its own nearest
        # neighbour at distance 0 and leave nothing to learn.
        q = self.net.q_taken(h, batch["action"].long())
        self._write(batch, h.detach(), y)
        loss = (weights * (y - q).pow(2)).mean()
        self.optimizer.zero_grad(set_to_none=True)
        self.dnd_optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.net.embed.parameters(), self.config.max_grad_norm)
        self.optimizer.step()
        self.dnd_optimizer.step()
        figures = {"loss": loss.item(), "q_mean": q.detach().mean().item()}
        figures["dnd_size"] = float(sum(dnd.used for dnd in self.net.dictionaries))
        return None, figures

    def _write(self, batch, h: torch.Tensor, y: torch.Tensor) -> None:
        """Writes (h, y) of the items not written before to their action's DND."""
        ids = item_ids(batch)
        new = [i for i, item in enumerate(ids) if item not in self.written]
        for i in new:
            self.written[ids[i]] = None
        while len(self.written) > self.settings.capacity:
            self.written.popitem(last=False)
        if not new:
            return
        actions = batch["action"].long().cpu().numpy()[new]
        keys, values = h[new].float().cpu().numpy(), y[new].float().cpu().numpy()
        for a, dnd in enumerate(self.net.dictionaries):
            mine = actions == a
            if mine.any():
                dnd.write(keys[mine], values[mine])

    def parameters(self) -> dict[str, np.ndarray]:
        """The embedding as it is; each DND as last published, refreshed in the rows written
        since and in the next 1/refresh_versions of its slots (a bounded refresh: an update
        moves the keys and values of every neighbour it looked up, which in a few updates is
        most rows, so a whole DND per version would be most of the payload)."""
        live = state_to_numpy(self.net)
        capacity, every = self.settings.dnd_capacity, self.settings.refresh_versions
        if self.published is None or every == 1:
            for dnd in self.net.dictionaries:
                dnd.written_slots.clear()
            self.published = live
            return {name: a.copy() for name, a in live.items()}
        share = np.arange(self.refresh_from, self.refresh_from + -(-capacity // every)) % capacity
        self.refresh_from = int(share[-1] + 1) % capacity
        arrays = {}
        for name, array in live.items():
            if name.startswith("dnds.") and array.shape[:1] == (capacity,):
                dnd = self.net.dictionaries[int(name.split(".")[1])]
                rows = np.union1d(
                    share, np.fromiter(dnd.written_slots, np.int64, len(dnd.written_slots))
                )
                array, fresh = self.published[name].copy(), array
                array[rows] = fresh[rows]
            arrays[name] = array
        for dnd in self.net.dictionaries:
            dnd.written_slots.clear()
        self.published = arrays
        return {name: a.copy() for name, a in arrays.items()}

    def state(self) -> tuple[dict[str, np.ndarray], dict]:
        arrays = {f"online/{k}": v for k, v in state_to_numpy(self.net).items()}
        for a, dnd in enumerate(self.net.dictionaries):
            arrays[f"last_used/{a}"] = dnd.last_used.cpu().numpy()
        optimizer, groups = optimizer_state(self.optimizer, "optimizer")
        # SparseAdam counts its steps in a Python int: stored as an array, restored as an int.
        dnd_state = self.dnd_optimizer.state_dict()
        dnd_optimizer = {
            f"dnd_optimizer/{index}/{key}": np.asarray(
                value.detach().cpu() if torch.is_tensor(value) else value
            )
            for index, entries in dnd_state["state"].items()
            for key, value in entries.items()
        }
        dnd_groups = dnd_state["param_groups"]
        meta = {"param_groups": groups, "dnd_param_groups": dnd_groups}
        meta["clocks"] = [dnd.clock for dnd in self.net.dictionaries]
        return arrays | optimizer | dnd_optimizer, meta

    def load_state(self, arrays: dict[str, np.ndarray], meta: dict) -> None:
        load_numpy_state(self.net, prefixed(arrays, "online"))
        self.published = None  # the next version is the restored net whole
        for a, dnd in enumerate(self.net.dictionaries):
            dnd.last_used.copy_(torch.from_numpy(arrays[f"last_used/{a}"]))
            dnd.clock = meta["clocks"][a]
        load_optimizer_state(self.optimizer, arrays, "optimizer", meta["param_groups"])
        load_optimizer_state(self.dnd_optimizer, arrays, "dnd_optimizer", meta["dnd_param_groups"])
        for entries in self.dnd_optimizer.state.values():
            entries["step"] = int(entries["step"])
