"""R2D2's loss on sequences, as pure functions (Kapturowski et al. 2019; rlax's
transformed_n_step_q_learning as Acme's R2D2 learner uses it).

- Value rescaling h(x) = sign(x)(sqrt(|x| + 1) - 1) + eps x and its inverse (Pohlen et al.
  2018): the network learns h(Q), so returns of any scale give targets of a similar one.
- n-step double Q: y_t = h(sum_{k<m} (prod d) r_{t+k} + (prod d) h^-1(Q_target(s_{t+m},
  argmax_a Q(s_{t+m}, a)))), m = min(n, the real steps left): a sequence's last steps bootstrap
  from its last observation, and a terminal step's discount 0 cuts every later term.
- Burn-in: the first `burn_in` steps only unroll the stored state forward, without gradient;
  the state they end in starts the steps that are learned from.
- Priorities: eta * max|delta| + (1 - eta) * mean|delta| over a sequence's learned steps.
"""

import torch

from apexrl.algorithms.r2d2.networks import RecurrentQNetwork

H_EPSILON = 1e-3  # the paper's eps in h


def rescale(x: torch.Tensor, eps: float = H_EPSILON) -> torch.Tensor:
    """h(x) = sign(x) (sqrt(|x| + 1) - 1) + eps x."""
    return torch.sign(x) * (torch.sqrt(x.abs() + 1.0) - 1.0) + eps * x


def unrescale(x: torch.Tensor, eps: float = H_EPSILON) -> torch.Tensor:
    """h^-1(x) = sign(x) (((sqrt(1 + 4 eps (|x| + 1 + eps)) - 1) / (2 eps))^2 - 1)."""
    root = (torch.sqrt(1.0 + 4.0 * eps * (x.abs() + 1.0 + eps)) - 1.0) / (2.0 * eps)
    return torch.sign(x) * (root.square() - 1.0)


def priority_mix(td_errors: torch.Tensor, mask: torch.Tensor, eta: float) -> torch.Tensor:
    """eta * max_t |td| + (1 - eta) * mean_t |td| [B] over the steps where mask [B, T] is 1 (0 for
    a sequence without any)."""
    magnitude = td_errors.abs() * mask
    count = mask.sum(1)
    mean = magnitude.sum(1) / count.clamp(min=1.0)
    return eta * magnitude.max(1).values + (1.0 - eta) * mean


def nstep_returns(rewards, discounts, values, real, n: int) -> torch.Tensor:
    """n-step returns [B, T] bootstrapped from `values` [B, T + 1] (values[:, j]: the value of the
    observation before step j, j = T: after the last step). rewards, discounts [B, T]; real [B]:
    the real steps of each sequence (padding after them): step t bootstraps from
    values[:, min(t + n, real)]. Steps at or past `real` get garbage (mask them)."""
    steps = rewards.shape[1]
    t = torch.arange(steps, device=rewards.device).expand_as(rewards)
    end = torch.minimum(t + n, real.unsqueeze(1).expand_as(t))
    total = torch.zeros_like(rewards)
    scale = torch.ones_like(rewards)
    for k in range(n):
        index = (t + k).clamp(max=steps - 1)
        live = (t + k) < end
        total = total + torch.where(live, scale * rewards.gather(1, index), 0.0)
        scale = torch.where(live, scale * discounts.gather(1, index), scale)
    return total + scale * values.gather(1, end.clamp(max=steps))


def unroll_with_burn_in(
    net: RecurrentQNetwork, obs: torch.Tensor, state: torch.Tensor, burn_in: int
):
    """Q-values [B, T + 1 - burn_in, A] of obs [B, T + 1, ...] after the first `burn_in` steps,
    which only advance the stored state [B, S] (no gradient flows through them)."""
    if burn_in:
        with torch.no_grad():
            _, state = net.unroll(obs[:, :burn_in], state)
    q, _ = net.unroll(obs[:, burn_in:], state)
    return q


def sequence_td_errors(
    online: RecurrentQNetwork,
    target: RecurrentQNetwork,
    batch: dict[str, torch.Tensor],
    burn_in: int,
    n: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(td errors [B, T - burn_in] of the learned steps, their mask, Q(s, a) there) of a batch of
    sequences (the columns adders/sequence.py writes)."""
    obs, state = batch["observations"], batch["state"]
    q = unroll_with_burn_in(online, obs, state, burn_in)
    with torch.no_grad():
        q_target = unroll_with_burn_in(target, obs, state, burn_in)
    return td_errors(q, q_target, batch, burn_in, n)


def td_errors(
    q: torch.Tensor, q_target: torch.Tensor, batch: dict[str, torch.Tensor], burn_in: int, n: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """sequence_td_errors from the online and target Q-values [B, T + 1 - burn_in, A] of the
    learned steps' observations and the one after the last real step (at the sequence's
    index `real`; rows after it are never read)."""
    with torch.no_grad():
        greedy = q[:, 1:].detach().argmax(2, keepdim=True)
        bootstrap = unrescale(q_target[:, 1:].gather(2, greedy).squeeze(2))
        # values[:, j] for j = 0 .. T - burn_in; index 0 is never a bootstrap (m >= 1).
        values = torch.cat([torch.zeros_like(bootstrap[:, :1]), bootstrap], 1)
        mask = batch["mask"][:, burn_in:]
        real = (batch["mask"].sum(1) - burn_in).clamp(min=0).long()
        returns = nstep_returns(
            batch["rewards"][:, burn_in:], batch["discounts"][:, burn_in:], values, real, n
        )
        y = rescale(returns)
    actions = batch["actions"][:, burn_in:].long().unsqueeze(2)
    q_taken = q[:, :-1].gather(2, actions).squeeze(2)
    return (y - q_taken) * mask, mask, q_taken


def r2d2_loss(online, target, batch, weights, burn_in: int, n: int, eta: float):
    """(importance-weighted loss, priorities [B] detached, mean Q(s, a) of the learned steps):
    half the squared TD error summed over a sequence's learned steps, divided by their
    number of places (so the scale does not grow with the length), weighted per sequence."""
    td, mask, q_taken = sequence_td_errors(online, target, batch, burn_in, n)
    per_sequence = 0.5 * td.square().sum(1) / td.shape[1]
    loss = (weights * per_sequence).mean()
    q_mean = (q_taken.detach() * mask).sum() / mask.sum().clamp(min=1.0)
    return loss, priority_mix(td.detach(), mask, eta), q_mean
