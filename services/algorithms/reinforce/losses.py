"""REINFORCE's returns and loss (Williams 1992; with a baseline as Sutton and Barto's
"REINFORCE with baseline", section 13.4), for discrete actions (a Categorical over logits).

Items are whole episodes, batch-major and padded (adders/episode.py), every tensor [B, T]:
- `rewards[t]`, `discounts[t]`: gamma where the episode goes on after step t (a time limit or
  the adder's cut included: not a terminal state), 0 where it terminated at step t;
- `mask[t]`: 1 on real steps, 0 on the padding after them.

The advantage is the return minus the baseline, normalised over the batch's real steps:
  baseline "none":  A_t = normalised(G_t)
  baseline "value": A_t = normalised(G_t - V(s_t)), V regressed on G_t.
Normalising the difference, rather than subtracting V from normalised returns, keeps V in the
returns' own scale, the scale in which it bootstraps a truncated episode's return.
"""

import numpy as np
import torch


@torch.no_grad()
def discounted_returns(
    rewards: torch.Tensor, discounts: torch.Tensor, mask: torch.Tensor, bootstrap: torch.Tensor
) -> torch.Tensor:
    """G_t [B, T] on real steps, 0 on padding: G_t = r_t + discount_t * G_{t+1}, from the back,
    where G after an item's last real step is `bootstrap` [B] (V of the observation after it,
    or 0 without a baseline); a terminal's discount 0 cuts it off.

    The recursion runs in numpy on the CPU, a step of it a few microseconds: in torch, 16 items
    of 500 steps took 60 ms of an update's 100-140 ms, in numpy 7 ms (one CPU thread)."""
    r, d, real = (x.float().cpu().numpy() for x in (rewards, discounts, mask))
    returns = np.zeros_like(r)
    following = bootstrap.float().cpu().numpy()
    for t in reversed(range(r.shape[1])):
        following = np.where(real[:, t] > 0, r[:, t] + d[:, t] * following, following)
        returns[:, t] = following
    return torch.from_numpy(returns * real).to(rewards.device)


def masked_normalized(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(x - mean) / (std + 1e-8) over the real steps (std with n - 1, as torch.std); unchanged
    where there are fewer than 2 real steps. Padding stays where it was (the loss masks it)."""
    n = mask.sum()
    if n < 2:
        return x
    mean = (x * mask).sum() / n
    std = (((x - mean) ** 2 * mask).sum() / (n - 1)).sqrt()
    return (x - mean) / (std + 1e-8)


def reinforce_loss(
    logits: torch.Tensor,
    actions: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    values: torch.Tensor | None = None,
    value_cost: float = 0.5,
    entropy_cost: float = 0.0,
    normalize: bool = True,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The loss on a batch of episodes and its figures (detached scalars).

    logits [B, T, A] and values [B, T] (None: no baseline) are the learner's, with gradients;
    actions, returns (discounted_returns) and mask are [B, T]. Every term is a mean over the
    batch's real steps (the padding's mask is 0):
      policy:  -log pi(a_t | s_t) * A_t, A_t as the module's docstring says
      value:   value_cost * (G_t - V(s_t))^2
      entropy: -entropy_cost * H(pi(. | s_t))
    """
    n = mask.sum().clamp(min=1)
    advantages = returns if values is None else returns - values.detach()
    if normalize:
        advantages = masked_normalized(advantages, mask)
    log_pi = torch.log_softmax(logits, -1)
    taken = log_pi.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    policy_loss = -(taken * advantages * mask).sum() / n
    entropy = (-(log_pi.exp() * log_pi).sum(-1) * mask).sum() / n
    value_loss = (
        returns.new_zeros(()) if values is None else ((returns - values) ** 2 * mask).sum() / n
    )
    loss = policy_loss + value_cost * value_loss - entropy_cost * entropy
    figures = {
        "loss": loss.detach(),
        "policy_loss": policy_loss.detach(),
        "value_loss": value_loss.detach(),
        "entropy": entropy.detach(),
        "return_mean": (returns * mask).sum() / n,
    }
    return loss, figures
