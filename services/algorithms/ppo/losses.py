"""GAE and the PPO loss (Schulman et al. 2016, "High-Dimensional Continuous Control Using
Generalized Advantage Estimation"; Schulman et al. 2017, "Proximal Policy Optimization
Algorithms", eq. (7) and (9)), for a softmax policy over logits (Categorical) or a diagonal
Gaussian (gaussian.DiagGaussian): the loss reads the policy through its distribution.

Follows Stable-Baselines3 (RolloutBuffer.compute_returns_and_advantage and PPO.train): an
unclipped MSE value loss, advantages normalized per minibatch, the same approx_kl and
clip_fraction figures.

An unroll of length T from B envs is time-major, every tensor [T, B]:
- `rewards[t]`, `discounts[t]`: gamma where the episode continues after step t, 0 where it
  terminated at step t; a 0 cuts every sum that reaches past t.
- `values[t]` = V(x_t) and `bootstrap_value` [B] = V(x_T), the observation after the last step.
A TRUNCATED episode (time limit, not a terminal state) never reaches the learner as such: the
actor replaces the truncated step's reward r by r + gamma * V_behaviour(final observation) and
its discount by 0 (as Stable-Baselines3 does). The advantages are then those of an unroll that
continued into an observation of that value.

A2C is PPO's special case: clip_range=None and one epoch over each fresh batch (the caller's
choice). The ratio is then 1 at the behaviour policy, and the gradient of ratio * A there is
the gradient of log pi(a) * A: A2C's policy gradient.
"""

import torch
import torch.nn.functional as F

MAX_LOG_RATIO = 20.0


@torch.no_grad()
def gae(
    rewards: torch.Tensor,
    discounts: torch.Tensor,
    values: torch.Tensor,
    bootstrap_value: torch.Tensor,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimates and the value targets (advantages + values), [T, B]:

    A_t = delta_t + discount_t * lam * A_{t+1}, from the back, with A_T = 0 and
    delta_t = r_t + discount_t * V(x_{t+1}) - V(x_t). lam=1 gives the discounted return
    (bootstrapped with V(x_T)) minus V(x_t); lam=0 gives the one-step TD error.
    """
    next_values = torch.cat([values[1:], bootstrap_value.unsqueeze(0)])
    deltas = rewards + discounts * next_values - values
    advantages = torch.zeros_like(values)
    acc = torch.zeros_like(bootstrap_value)
    for t in reversed(range(values.shape[0])):
        acc = deltas[t] + discounts[t] * lam * acc
        advantages[t] = acc
    return advantages, advantages + values


class Categorical:
    """The softmax policy over logits [..., A]: log pi(a) and entropy from one log-softmax
    (torch's Categorical would check and normalize its arguments on every step: a fifth of a
    small network's step), and the exact KL between two such policies."""

    @staticmethod
    def evaluate(logits: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        log_pi = torch.log_softmax(logits, -1)
        log_prob = log_pi.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
        return log_prob, -(log_pi.exp() * log_pi).sum(-1)

    @staticmethod
    def kl(old_logits: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        return kl_divergence(old_logits, torch.log_softmax(logits, -1))


def ppo_loss(
    logits: torch.Tensor,
    actions: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    values: torch.Tensor,
    returns: torch.Tensor,
    clip_range: float | None = 0.2,
    vf_coef: float = 0.5,
    ent_coef: float = 0.0,
    normalize_advantages: bool = True,
    old_logits: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    distribution=Categorical,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The PPO loss on a minibatch and its figures (detached scalars).

    logits [..., A] (or a Gaussian's output [..., 2 * dims] with its `distribution`,
    gaussian.DiagGaussian, and actions [..., dims]) and values [...] are the learner's, with
    gradients; actions,
    old_log_probs (the behaviour policy's log pi_old(a)), advantages and returns (from gae())
    share their leading shape ([N] or [T, B]). Every term is a mean over the samples:
      policy:  -min(ratio * A, clip(ratio, 1 - clip_range, 1 + clip_range) * A),
               ratio = pi(a) / pi_old(a); clip_range=None is -ratio * A (A2C, see above)
      value:   vf_coef * (returns - V(x))^2
      entropy: -ent_coef * H(pi(. | x))
      KL penalty: kl_coef * KL(pi_old(. | x) || pi(. | x)), exact over the actions, pi_old
               given by old_logits (the "kl" figure, with kl_coef 0 too when they are given)
    normalize_advantages: A becomes (A - mean) / (std + 1e-8) over the minibatch (when it
    holds more than one sample).
    """
    if normalize_advantages:
        advantages = normalized(advantages)
    log_prob, entropies = distribution.evaluate(logits, actions)
    log_ratio = log_prob - old_log_probs
    policy_loss = clipped_surrogate(log_ratio, advantages, clip_range)
    value_loss = F.mse_loss(values, returns)
    entropy = entropies.mean()
    loss = policy_loss + vf_coef * value_loss - ent_coef * entropy
    kl = None if old_logits is None else distribution.kl(old_logits, logits)
    if kl is not None and kl_coef > 0:
        loss = loss + kl_coef * kl

    with torch.no_grad():
        ratio = torch.exp(log_ratio)
        # Schulman's low-variance estimator of KL(pi_old || pi), as SB3 reports it.
        approx_kl = ((ratio - 1) - log_ratio).mean()
        limit = torch.inf if clip_range is None else clip_range
        clip_fraction = ((ratio - 1).abs() > limit).float().mean()
    figures = {
        "loss": loss.detach(),
        "policy_loss": policy_loss.detach(),
        "value_loss": value_loss.detach(),
        "entropy": entropy.detach(),
        "approx_kl": approx_kl,
        "clip_fraction": clip_fraction,
    }
    if kl is not None:
        figures["kl"] = kl.detach()
    return loss, figures


def kl_divergence(old_logits: torch.Tensor, log_pi: torch.Tensor) -> torch.Tensor:
    """mean over the samples of KL(pi_old || pi) = sum_a pi_old(a) (log pi_old(a) - log pi(a))."""
    log_old = torch.log_softmax(old_logits, -1)
    return (log_old.exp() * (log_old - log_pi)).sum(-1).mean()


def adapted_kl_coef(coef: float, kl: float, target: float, bounds: tuple[float, float]) -> float:
    """The adaptive KL penalty's rule (Schulman et al. 2017, section 4): doubled when the
    update's KL ends above 1.5x the target, halved below target / 1.5, within bounds."""
    if kl > 1.5 * target:
        coef *= 2
    elif kl < target / 1.5:
        coef /= 2
    return min(max(coef, bounds[0]), bounds[1])


def normalized(advantages: torch.Tensor) -> torch.Tensor:
    """(A - mean) / (std + 1e-8), over all of A; unchanged when it holds one sample."""
    if advantages.numel() < 2:
        return advantages
    return (advantages - advantages.mean()) / (advantages.std() + 1e-8)


def clipped_surrogate(
    log_ratio: torch.Tensor, advantages: torch.Tensor, clip_range: float | None
) -> torch.Tensor:
    """PPO's policy loss, -mean(min(r A, clip(r, 1 - clip_range, 1 + clip_range) A)) with
    r = pi(a) / pi_old(a) = exp(log_ratio); clip_range None: -mean(r A), whose gradient at r = 1
    is the policy gradient's, -A grad log pi(a).

    log_ratio is capped at 20 (r = 4.9e8) first: a policy that far from the batch's (an
    impala learner's can be, on unrolls its lagging actors acted) would overflow r to inf, and
    the zero gradient of a clipped step times inf is NaN in every parameter.
    """
    ratio = torch.exp(log_ratio.clamp(max=MAX_LOG_RATIO))
    surrogate = ratio * advantages
    if clip_range is not None:
        clipped = ratio.clamp(1 - clip_range, 1 + clip_range) * advantages
        surrogate = torch.min(surrogate, clipped)
    return -surrogate.mean()
