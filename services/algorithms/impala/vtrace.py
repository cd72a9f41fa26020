"""V-trace targets and the IMPALA loss (Espeholt et al. 2018, "IMPALA: Scalable Distributed
Deep-RL with Importance Weighted Actor-Learner Architectures", eq. (1) and section 4.2).

Follows DeepMind's reference implementation (scalable_agent/vtrace.py,
`from_importance_weights`, and the losses in scalable_agent/experiment.py), with the trace clip
c-bar a parameter as in the paper (the reference and rlax's `vtrace` fix it at 1).

An unroll of length T from B envs is time-major, every tensor [T, B]:
- `rewards[t]`, `discounts[t]`: gamma where the episode continues after step t, 0 where it
  terminated at step t; a 0 cuts every sum that reaches past t.
- `behaviour_log_probs[t]`: log mu(a_t | x_t) of the policy that acted (the actor's);
  `target_log_probs[t]`: log pi(a_t | x_t) of the policy being learned.
- `values[t]` = V(x_t) and `bootstrap_value` [B] = V(x_T), the observation after the last
  step, both from the learner's network.
A TRUNCATED episode (time limit, not a terminal state) never reaches the learner as such: the
actor replaces the truncated step's reward r by r + gamma * V_behaviour(final observation) and
its discount by 0 (as Stable-Baselines3 does for PPO). The targets are then those of an unroll
that continued into an observation of that value; the value is the actor's, not the learner's.
"""

from typing import NamedTuple

import torch

from apexrl.algorithms.ppo.losses import Categorical, clipped_surrogate, normalized


class VTrace(NamedTuple):
    vs: torch.Tensor  # [T, B] value targets v_s
    pg_advantages: torch.Tensor  # [T, B] clipped rho_s * (r_s + gamma_s v_{s+1} - V(x_s))
    rhos: torch.Tensor  # [T, B] unclipped importance ratios pi / mu (for metrics)


@torch.no_grad()
def vtrace(
    behaviour_log_probs: torch.Tensor,
    target_log_probs: torch.Tensor,
    rewards: torch.Tensor,
    discounts: torch.Tensor,
    values: torch.Tensor,
    bootstrap_value: torch.Tensor,
    clip_rho: float = 1.0,
    clip_c: float = 1.0,
    clip_pg_rho: float = 1.0,
    lam: float = 1.0,
) -> VTrace:
    """V-trace targets, no gradient: clip_rho is rho-bar (fixed point), clip_c is c-bar (how far
    traces reach), clip_pg_rho clips the policy-gradient ratio; math.inf turns a clip off.

    v_s - V(x_s) = delta_s + discount_s * c_s * (v_{s+1} - V(x_{s+1})), from the back, with
    delta_s = rho_s * (r_s + discount_s * V(x_{s+1}) - V(x_s)), v_T = V(x_T) and
    c_s = lam * min(c-bar, rho_s): lam < 1 shortens the traces as in Retrace(lambda) (a
    variant the IMPALA paper notes; rlax's `lambda_`). On-policy it is GAE(lambda)'s recursion.
    """
    rhos = torch.exp(target_log_probs - behaviour_log_probs)
    clipped_rhos = rhos.clamp(max=clip_rho)
    cs = lam * rhos.clamp(max=clip_c)
    next_values = torch.cat([values[1:], bootstrap_value.unsqueeze(0)])
    deltas = clipped_rhos * (rewards + discounts * next_values - values)

    vs_minus_values = torch.zeros_like(values)
    acc = torch.zeros_like(bootstrap_value)
    for t in reversed(range(values.shape[0])):
        acc = deltas[t] + discounts[t] * cs[t] * acc
        vs_minus_values[t] = acc
    vs = vs_minus_values + values

    next_vs = torch.cat([vs[1:], bootstrap_value.unsqueeze(0)])
    pg_advantages = rhos.clamp(max=clip_pg_rho) * (rewards + discounts * next_vs - values)
    return VTrace(vs, pg_advantages, rhos)


def impala_loss(
    logits: torch.Tensor,
    actions: torch.Tensor,
    values: torch.Tensor,
    targets: VTrace,
    baseline_cost: float = 0.5,
    entropy_cost: float = 0.01,
    start_log_probs: torch.Tensor | None = None,
    clip_range: float | None = None,
    normalize: bool = False,
    distribution=Categorical,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The IMPALA loss of a softmax policy (or a Gaussian's, with `distribution`
    gaussian.DiagGaussian) and its figures (detached scalars).

    logits [T, B, A] (a Gaussian's output [T, B, 2 * dims]) and values [T, B] are the
    learner's, with gradients; targets is what
    vtrace() returned for the same unroll. Every term is a mean over the T * B steps (the
    reference sums; a mean keeps learning rates independent of T and B):
      policy:   -log pi(a_t | x_t) * pg_advantage_t
      baseline: baseline_cost * 0.5 * (v_t - V(x_t))^2   (its gradient is v_t - V(x_t))
      entropy:  -entropy_cost * H(pi(. | x_t))          (a bonus: lowers the loss)
    normalize: the pg advantages scaled to mean 0, std 1 over the batch first (as PPO's).
    start_log_probs (log pi_0(a_t | x_t) [T, B], of the learner's policy when it computed
    `targets`): the policy term becomes PPO's clipped surrogate on the V-trace advantages, as
    RLlib's APPO has it, -min(r A, clip(r, 1 - eps, 1 + eps) A) with r = pi / pi_0 and eps
    `clip_range` (None: -r A). At r = 1 its gradient is the plain term's; a learner taking
    several steps on one batch stops pulling a ratio past the clip.
    """
    log_pi, entropies = distribution.evaluate(logits, actions)
    advantages = normalized(targets.pg_advantages) if normalize else targets.pg_advantages
    if start_log_probs is None:
        policy_loss = -(log_pi * advantages).mean()
    else:
        policy_loss = clipped_surrogate(log_pi - start_log_probs, advantages, clip_range)
    baseline_loss = 0.5 * (targets.vs - values).pow(2).mean()
    entropy = entropies.mean()
    loss = policy_loss + baseline_cost * baseline_loss - entropy_cost * entropy
    figures = {
        "loss": loss.detach(),
        "policy_loss": policy_loss.detach(),
        "baseline_loss": baseline_loss.detach(),
        "entropy": entropy.detach(),
        "rho_mean": targets.rhos.mean(),
    }
    return loss, figures
