"""UNREAL's auxiliary losses (Jaderberg et al. 2016, section 3 and appendix), pure functions of
the network's outputs and replayed data. Follows miyosuda's UNREAL (the paper's published
re-implementation): pixel changes on intensities in [0, 1] over the 80x80 centre, targets
bootstrapped from the learner's own network, no target network.

Sequences are time-major, [T, B, ...]; `discounts[t]` is 0 where the episode ended at step t
(a 0 cuts every return that reaches past it), as in the unrolls (adders/unroll.py).
"""

import torch
import torch.nn.functional as F

CELL = 4  # pixels per cell side
CROP = 2  # pixels cut off each side of the 84x84 frame: the 80x80 centre, 20x20 cells


def pixel_change(frames: torch.Tensor, next_frames: torch.Tensor) -> torch.Tensor:
    """Pixel control's pseudo-rewards: the mean absolute change of each 4x4 cell of the frames'
    centre, frames [..., 84, 84] uint8 -> [..., 20, 20] float in [0, 1]."""
    change = (next_frames.float() - frames.float()).abs() / 255.0
    change = change[..., CROP:-CROP, CROP:-CROP]
    h, w = change.shape[-2:]
    cells = change.reshape(*change.shape[:-2], h // CELL, CELL, w // CELL, CELL)
    return cells.mean(dim=(-3, -1))


@torch.no_grad()
def nstep_returns(
    rewards: torch.Tensor, discounts: torch.Tensor, bootstrap: torch.Tensor
) -> torch.Tensor:
    """R_t = r_t + discount_t * R_{t+1}, R_T = bootstrap: rewards [T, B, ...], discounts [T, B]
    (broadcast over the rest), bootstrap [B, ...] -> [T, B, ...]."""
    extra = rewards.dim() - discounts.dim()
    discounts = discounts.reshape(*discounts.shape, *([1] * extra))
    returns = torch.empty_like(rewards)
    acc = bootstrap
    for t in reversed(range(rewards.shape[0])):
        acc = rewards[t] + discounts[t] * acc
        returns[t] = acc
    return returns


def pixel_control_loss(
    q: torch.Tensor,
    actions: torch.Tensor,
    frames: torch.Tensor,
    discounts: torch.Tensor,
    gamma: float,
) -> torch.Tensor:
    """n-step Q-learning of the pixel changes: q [T + 1, B, A, 20, 20] (the learner's, with
    gradients), actions [T, B], frames [T + 1, B, 84, 84] (each step's newest frame),
    discounts [T, B]. Target R_t = c_t + gamma' R_{t+1} with c_t the change from frame t to
    t + 1, gamma' = gamma where the episode goes on and 0 where it ended, and
    R_T = max_a Q(x_T, a) (no gradient); loss: the squared error of Q(x_t, a_t) per cell,
    summed over the cells, mean over the T * B steps."""
    rewards = pixel_change(frames[:-1], frames[1:])
    cut = torch.where(discounts > 0, gamma, 0.0).to(rewards.dtype)
    targets = nstep_returns(rewards, cut, q[-1].detach().max(dim=1).values)
    index = actions[:, :, None, None, None].expand(-1, -1, 1, *q.shape[-2:])
    taken = q[:-1].gather(2, index).squeeze(2)
    return (targets - taken).pow(2).sum(dim=(-2, -1)).mean()


def value_replay_loss(
    values: torch.Tensor, rewards: torch.Tensor, discounts: torch.Tensor
) -> torch.Tensor:
    """Value regression on a replayed sequence: values [T + 1, B] (the learner's, with
    gradients), rewards and discounts [T, B]; targets R_t = r_t + discount_t R_{t+1},
    R_T = V(x_T) (no gradient); loss 0.5 (R_t - V(x_t))^2, mean over the T * B steps."""
    targets = nstep_returns(rewards, discounts, values[-1].detach())
    return 0.5 * (targets - values[:-1]).pow(2).mean()


def reward_classes(rewards: torch.Tensor, threshold: float) -> torch.Tensor:
    """0 where |reward| <= threshold, 1 where it is above, 2 where below -threshold."""
    classes = torch.zeros_like(rewards, dtype=torch.int64)
    classes[rewards > threshold] = 1
    classes[rewards < -threshold] = 2
    return classes


def reward_prediction_loss(
    logits: torch.Tensor, rewards: torch.Tensor, threshold: float
) -> torch.Tensor:
    """Cross-entropy of the reward's class: logits [B, 3], rewards [B]."""
    return F.cross_entropy(logits.float(), reward_classes(rewards, threshold))
