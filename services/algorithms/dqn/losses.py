"""Double-DQN losses on n-step transitions with prioritized-replay importance weights: the
expected-Q one (Huber) and the distributional one (C51's cross-entropy).

The actor folds n-step bookkeeping into two columns: `reward` is the discounted
n-step return and `discount` is gamma^m * (1 - terminated). So the target is just
y = reward + discount * Q_target(next_obs, argmax_a Q_online(next_obs, a)),
and the learner never needs n or gamma.
"""

import torch
import torch.nn.functional as F
from torch import nn

from apexrl.algorithms.dqn.networks import QNetwork


def td_targets(
    online: nn.Module,
    target: nn.Module,
    reward: torch.Tensor,
    discount: torch.Tensor,
    next_obs: torch.Tensor,
) -> torch.Tensor:
    """Double-DQN targets [B]: online net picks the next action, target net values it."""
    with torch.no_grad():
        next_q = online(next_obs)
        next_action = next_q.argmax(dim=1, keepdim=True)
        # An actor's priorities take its one net as both (Ape-X): one pass over next_obs, not
        # two (a third of the CNN passes of an Atari actor's priorities).
        values = next_q if target is online else target(next_obs)
        next_value = values.gather(1, next_action).squeeze(1)
        return reward + discount * next_value


def dqn_loss(
    online: nn.Module,
    target: nn.Module,
    batch: dict[str, torch.Tensor],
    weights: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Importance-weighted mean Huber loss, the detached TD errors [B] for new priorities, and
    the detached Q(obs, action) [B] (for metrics).

    batch holds the transition columns obs, action (int64), reward, discount, next_obs.
    """
    y = td_targets(online, target, batch["reward"], batch["discount"], batch["next_obs"])
    q = online(batch["obs"]).gather(1, batch["action"].long().unsqueeze(1)).squeeze(1)
    # Huber with delta 1 per item, then scaled by the importance weights before the mean.
    per_item = F.huber_loss(q, y, reduction="none", delta=1.0)
    loss = (weights * per_item).mean()
    td_errors = (y - q).detach()
    return loss, td_errors, q.detach()


def project_distribution(
    probs: torch.Tensor, reward: torch.Tensor, discount: torch.Tensor, support: torch.Tensor
) -> torch.Tensor:
    """C51's projected Bellman target (Bellemare et al. 2017, Algorithm 1): the next state's
    distribution `probs` [B, atoms] over `support` [atoms], shifted to reward + discount * z,
    clipped to [v_min, v_max], and each atom's mass split between the two atoms around it,
    in proportion to its distance from each. Discount 0 (a terminal) puts all mass at the
    reward. Returns [B, atoms], each row summing to 1."""
    v_min, v_max, atoms = support[0], support[-1], len(support)
    delta = (v_max - v_min) / (atoms - 1)
    shifted = (reward[:, None] + discount[:, None] * support[None, :]).clamp(v_min, v_max)
    position = (shifted - v_min) / delta  # in [0, atoms - 1]
    lower, upper = position.floor().long(), position.ceil().long()
    # An atom that lands exactly on a support point (lower == upper) keeps its whole mass there.
    lower_share = (upper.float() - position) + (lower == upper).float()
    upper_share = position - lower.float()
    target = torch.zeros_like(probs)
    target.scatter_add_(1, lower, probs * lower_share)
    target.scatter_add_(1, upper, probs * upper_share)
    return target


def c51_loss(
    online: QNetwork,
    target: QNetwork,
    batch: dict[str, torch.Tensor],
    weights: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rainbow's distributional loss: the importance-weighted mean cross-entropy between the
    projected double-Q target distribution and the online one of the action taken; the
    detached KL divergences [B] for new priorities (Hessel et al. 2018 prioritise by the KL
    loss); the detached expected Q(obs, action) [B] (for metrics).

    online and target are C51 QNetworks (`log_probs`, `support`)."""
    support = online.support
    if support is None:
        raise ValueError("c51_loss: online has no support, it is no C51 network")
    with torch.no_grad():
        next_action = online(batch["next_obs"]).argmax(dim=1)
        next_probs = target.log_probs(batch["next_obs"]).exp()
        next_probs = next_probs[torch.arange(len(next_action)), next_action]
        m = project_distribution(next_probs, batch["reward"], batch["discount"], support)
    log_p = online.log_probs(batch["obs"])[torch.arange(len(m)), batch["action"].long()]
    cross_entropy = -(m * log_p).sum(dim=1)
    loss = (weights * cross_entropy).mean()
    with torch.no_grad():
        kl = (m * (m.clamp_min(1e-12).log() - log_p)).sum(dim=1).clamp_min(0.0)
        q = (log_p.exp() * support).sum(dim=1)
    return loss, kl, q


def loss_of(net):
    """The loss a network trains with: C51's for a distributional head, else the Huber TD loss;
    both return (loss, priorities >= 0 [B], Q(obs, action) [B])."""
    if net.support is not None:
        return c51_loss

    def huber(online, target, batch, weights):
        loss, td_errors, q = dqn_loss(online, target, batch, weights)
        return loss, td_errors.abs(), q

    return huber
