"""A3C's learner side: the dataset that drains the gradient queue, dropping gradients too
stale to apply, and the update that applies each gradient to the shared parameters
(builder.py says why gradients are items)."""

from dataclasses import dataclass

import numpy as np
import torch

from apexrl.algorithms.a3c.builder import ITEM_FIGURES
from apexrl.algorithms.actor_critic import UnrollLearning
from apexrl.algorithms.datasets import Queue


@dataclass
class FreshGradients(Queue):
    """The queue's gradients one at a time, oldest first, each kept if it was computed on one
    of the `max_staleness` + 1 newest versions (its staleness, the newest version minus its
    own, goes with it as the column "staleness"), else dropped and counted. A version newer
    than the learner's newest is of a learner that published it before a restart from an
    older checkpoint: dropped too. A new version after every update."""

    max_staleness: int = 0
    batch_size: int = 1
    publish_every_update: bool = True

    def gather(self, item, version: int) -> tuple[tuple | None, int]:
        columns, weights, keys = item
        staleness = version - columns["version"]
        fresh = ((staleness >= 0) & (staleness <= self.max_staleness)).cpu().numpy()
        dropped = int((~fresh).sum())
        if not fresh.any():
            return None, dropped
        index = torch.from_numpy(np.flatnonzero(fresh)).to(weights.device)
        columns = {k: v[index] for k, v in columns.items()} | {"staleness": staleness[index]}
        return (columns, weights[index], keys[fresh]), dropped


class A3CLearning(UnrollLearning):
    """The actor-critic network of impala and ppo, and its optimizer (RMSProp by default): the
    shared parameters and the statistics every actor's gradients share."""

    def update(self, batch, weights, step):
        """Each gradient of the batch (one, from FreshGradients) in turn: unflattened into the
        parameters' .grad in parameters() order, its norm clipped at max_grad_norm, one
        optimizer step. No loss is computed here: the figures are those the actor computed on
        its unroll."""
        parameters = list(self.net.parameters())
        gradients = batch["gradient"]
        sizes, norms = [p.numel() for p in parameters], []
        if gradients.shape[1] != sum(sizes):
            raise ValueError(
                f"gradient: {gradients.shape[1]} values, the network has {sum(sizes)} parameters"
            )
        for gradient in gradients:
            for parameter, part in zip(parameters, gradient.split(sizes), strict=True):
                parameter.grad = part.view_as(parameter).to(parameter.dtype)
            norm = torch.nn.utils.clip_grad_norm_(parameters, self.config.max_grad_norm)
            norms.append(float(norm))
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        figures = {name: float(batch[name].float().mean()) for name in ("loss", *ITEM_FIGURES)}
        return None, figures | {
            "staleness": float(batch["staleness"].float().mean()),
            "gradient_norm": float(np.mean(norms)),
        }
