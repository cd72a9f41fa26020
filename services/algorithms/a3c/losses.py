"""A3C's n-step returns and loss (Mnih et al. 2016, Algorithm S3), on one actor's unroll of
its envs, time-major: every tensor [T, B] (B: the actor's envs), as UnrollLearning's forward
gives them.

- `rewards[t]`, `discounts[t]`: gamma, 0 where the episode ended at step t (terminated, or
  truncated: the adder then added gamma * V(final observation) to the reward, adders/unroll.py);
- R_t = r_t + discount_t * R_{t+1}, R_T = V(s_T) (the observation after the unroll, detached):
  each step's return over the rest of the unroll, "n-step" with n = T - t (the paper's
  "longest possible n-step return").

Loss, means over the T * B steps (the paper sums; a mean keeps the learning rate independent
of the unroll's size):
  policy:  -log pi(a_t | s_t) * (R_t - V(s_t)), the advantage detached
  value:   value_cost * 1/2 (R_t - V(s_t))^2
  entropy: -entropy_cost * H(pi(. | s_t))
"""

import torch

from apexrl.algorithms.ppo.losses import Categorical


def nstep_returns(
    rewards: torch.Tensor, discounts: torch.Tensor, bootstrap: torch.Tensor
) -> torch.Tensor:
    """R [T, B]: R_t = r_t + discount_t * R_{t+1}, from the back, R_T = bootstrap [B]; no
    gradient flows through it."""
    returns = torch.empty_like(rewards)
    with torch.no_grad():
        following = bootstrap
        for t in reversed(range(len(rewards))):
            following = rewards[t] + discounts[t] * following
            returns[t] = following
    return returns


def a3c_loss(
    policy_out: torch.Tensor,
    values: torch.Tensor,
    bootstrap: torch.Tensor,
    actions: torch.Tensor,
    rewards: torch.Tensor,
    discounts: torch.Tensor,
    *,
    value_cost: float,
    entropy_cost: float,
    distribution=Categorical,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The loss on one unroll and its figures (detached scalars).

    policy_out [T, B, P] (logits, or a Gaussian's mean and log-std) and values [T, B] carry
    the gradients; bootstrap [B] is V of the observation after the unroll; actions [T, B, ...],
    rewards and discounts [T, B]. `distribution` evaluates log pi(a) and the entropy
    (ppo.losses.Categorical, or gaussian.DiagGaussian)."""
    returns = nstep_returns(rewards, discounts, bootstrap.detach())
    advantages = returns - values.detach()
    log_pi, entropy = distribution.evaluate(policy_out, actions)
    policy_loss = -(log_pi * advantages).mean()
    value_loss = 0.5 * (returns - values).pow(2).mean()
    entropy = entropy.mean()
    loss = policy_loss + value_cost * value_loss - entropy_cost * entropy
    figures = {
        "loss": loss.detach(),
        "policy_loss": policy_loss.detach(),
        "value_loss": value_loss.detach(),
        "entropy": entropy.detach(),
        "value_mean": values.detach().mean(),
    }
    return loss, figures
