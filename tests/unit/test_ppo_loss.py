"""GAE and the PPO loss against numbers worked out by hand (gamma 0.9 unless said)."""

import math

import pytest
import torch

from apexrl.algorithms.ppo.losses import gae, ppo_loss
from tests.conftest import unroll_learning


def column(*values):
    """[T, 1]: one env's unroll."""
    return torch.tensor(values, dtype=torch.float32).unsqueeze(1)


def close(actual, expected):
    torch.testing.assert_close(actual, expected, rtol=1e-6, atol=1e-6)


# Env 0 runs through the unroll; env 1 terminates at step 1 and restarts at step 2.
REWARDS = torch.tensor([[1.0, 1.0], [2.0, 1.0], [3.0, 1.0]])
DISCOUNTS = torch.tensor([[0.9, 0.5], [0.9, 0.0], [0.9, 0.5]])
VALUES = torch.tensor([[0.5, 2.0], [1.0, 4.0], [1.5, 8.0]])
BOOTSTRAP = torch.tensor([2.0, 10.0])
# TD errors r + discount * V' - V:
# env 0: 1 + 0.9 * 1 - 0.5 = 1.4, 2 + 0.9 * 1.5 - 1 = 2.35, 3 + 0.9 * 2 - 1.5 = 3.3
# env 1: 1 + 0.5 * 4 - 2 = 1, 1 + 0 - 4 = -3, 1 + 0.5 * 10 - 8 = -2


@pytest.mark.parametrize(
    "lam, advantages",
    [
        # Discounted returns bootstrapped with V(x_T), minus V:
        # env 0: returns 6.688, 6.32, 4.8 (4.8 = 3 + 0.9 * 2, 6.32 = 2 + 0.9 * 4.8, ...)
        # env 1: returns 1.5, 1, 6 (the termination at step 1 hides steps 2 and on)
        (1.0, [[6.188, -0.5], [5.32, -3.0], [3.3, -2.0]]),
        # The TD errors themselves.
        (0.0, [[1.4, 1.0], [2.35, -3.0], [3.3, -2.0]]),
        # A_t = delta_t + discount_t * 0.5 * A_{t+1}:
        # env 0: 3.3, 2.35 + 0.45 * 3.3 = 3.835, 1.4 + 0.45 * 3.835 = 3.12575
        # env 1: -2, -3 + 0, 1 + 0.25 * -3 = 0.25
        (0.5, [[3.12575, 0.25], [3.835, -3.0], [3.3, -2.0]]),
    ],
)
def test_gae(lam, advantages):
    got, returns = gae(REWARDS, DISCOUNTS, VALUES, BOOTSTRAP, lam)
    close(got, torch.tensor(advantages))
    close(returns, torch.tensor(advantages) + VALUES)


def test_gae_truncated_end_is_a_bootstrapped_reward_with_discount_zero():
    # The episode hits its time limit at step 1 with V_behaviour(final observation) = 5; a new
    # episode starts at step 2. The actor writes reward 2 + 0.9 * 5 = 6.5 and discount 0 there.
    values = column(0.5, 1.0, 1.5)
    truncated, _ = gae(column(1.0, 6.5, 3.0), column(0.9, 0.0, 0.9), values, BOOTSTRAP[:1], 0.5)
    # A1 = 6.5 - 1 = 5.5; A0 = (1 + 0.9 * 1 - 0.5) + 0.45 * 5.5 = 3.875
    close(truncated[:2], column(3.875, 5.5))
    # The same as an unroll that continued after step 1 into an observation worth 5.
    continuing, _ = gae(column(1.0, 2.0), column(0.9, 0.9), values[:2], torch.tensor([5.0]), 0.5)
    close(truncated[:2], continuing)


def test_gae_carries_no_gradient():
    values = VALUES.clone().requires_grad_()
    advantages, returns = gae(REWARDS, DISCOUNTS, values, BOOTSTRAP, 0.95)
    assert not advantages.requires_grad and not returns.requires_grad


# Five samples, two actions, the current policy uniform (logits 0: pi(a) = 0.5); the old
# policy's log-probabilities make the ratios 1.5, 1.5, 0.5, 0.5, 1.1.
RATIOS = torch.tensor([1.5, 1.5, 0.5, 0.5, 1.1])
OLD_LOG_PROBS = math.log(0.5) - torch.log(RATIOS)
ACTIONS = torch.tensor([0, 0, 1, 1, 0])
ADVANTAGES = torch.tensor([1.0, -1.0, 1.0, -1.0, 2.0])
VALUES_5 = torch.tensor([1.0, 2.0, 3.0, 0.0, 0.0])
RETURNS_5 = torch.tensor([2.0, 2.0, 1.0, 0.0, 1.0])


def test_ppo_clipping_by_hand():
    logits = torch.zeros(5, 2, requires_grad=True)
    values = VALUES_5.clone().requires_grad_()
    loss, figures = ppo_loss(
        logits, ACTIONS, OLD_LOG_PROBS, ADVANTAGES, values, RETURNS_5, normalize_advantages=False
    )
    # min(ratio * A, clip(ratio, 0.8, 1.2) * A):
    # 1.5 * +1 -> 1.2 (clipped), 1.5 * -1 -> -1.5, 0.5 * +1 -> 0.5, 0.5 * -1 -> -0.8 (clipped),
    # 1.1 * 2 -> 2.2; policy loss -(1.2 - 1.5 + 0.5 - 0.8 + 2.2) / 5 = -0.32
    close(figures["policy_loss"], torch.tensor(-0.32))
    # (1 + 0 + 4 + 0 + 1) / 5
    close(figures["value_loss"], torch.tensor(1.2))
    close(figures["entropy"], torch.tensor(math.log(2.0)))
    close(loss, torch.tensor(-0.32 + 0.5 * 1.2))
    # |ratio - 1| > 0.2 for four of five samples.
    close(figures["clip_fraction"], torch.tensor(0.8))
    # mean((ratio - 1) - log ratio): 2 * (0.5 - log 1.5) + 2 * (-0.5 + log 2) + 0.1 - log 1.1
    approx_kl = (2 * (0.5 - math.log(1.5)) + 2 * (math.log(2.0) - 0.5) + 0.1 - math.log(1.1)) / 5
    close(figures["approx_kl"], torch.tensor(approx_kl))

    loss.backward()
    # Unclipped samples: d/dlogits of -ratio * A / 5 = -(A / 5) * ratio * (onehot(a) - pi).
    # Samples 0 (ratio above 1 + eps, A > 0) and 3 (below 1 - eps, A < 0) get no gradient.
    want = torch.tensor(
        [
            [0.0, 0.0],
            [0.15, -0.15],  # -(-1 / 5) * 1.5 * (0.5, -0.5)
            [0.05, -0.05],  # -(1 / 5) * 0.5 * (-0.5, 0.5)
            [0.0, 0.0],
            [-0.22, 0.22],  # -(2 / 5) * 1.1 * (0.5, -0.5)
        ]
    )
    close(logits.grad, want)
    # vf_coef * 2 * (V - R) / 5
    close(values.grad, torch.tensor([-0.2, 0.0, 0.4, 0.0, -0.2]))


def test_entropy_bonus_lowers_the_loss():
    args = (torch.zeros(5, 2), ACTIONS, OLD_LOG_PROBS, ADVANTAGES, VALUES_5, RETURNS_5)
    plain, _ = ppo_loss(*args, normalize_advantages=False)
    bonus, _ = ppo_loss(*args, ent_coef=0.01, normalize_advantages=False)
    close(bonus - plain, torch.tensor(-0.01 * math.log(2.0)))


def test_unclipped_one_epoch_is_a2c():
    # pi = (0.5, 0.5) then (0.75, 0.25); actions 0 then 1; A = 1, -2. The batch was just
    # collected by this policy: old log-probs are its own, every ratio is 1.
    logits = torch.tensor([[0.0, 0.0], [math.log(3.0), 0.0]], requires_grad=True)
    actions = torch.tensor([0, 1])
    advantages = torch.tensor([1.0, -2.0])
    old_log_probs = torch.log(torch.tensor([0.5, 0.25]))
    values = torch.zeros(2)
    loss, figures = ppo_loss(
        logits,
        actions,
        old_log_probs,
        advantages,
        values,
        values,
        clip_range=None,
        normalize_advantages=False,
    )
    # The value is -mean(ratio * A) = -(1 - 2) / 2, not A2C's -mean(log pi(a) * A) ...
    close(loss, torch.tensor(0.5))
    close(figures["clip_fraction"], torch.tensor(0.0))
    close(figures["approx_kl"], torch.tensor(0.0))
    loss.backward()
    # ... but the gradient is A2C's: d/dlogits of -log pi(a) * A / 2 = -(onehot(a) - pi) * A / 2
    # step 0: -((1, 0) - (0.5, 0.5)) * 1 / 2; step 1: -((0, 1) - (0.75, 0.25)) * -2 / 2
    close(logits.grad, torch.tensor([[-0.25, 0.25], [-0.75, 0.75]]))


def test_advantages_are_normalized_per_minibatch():
    logits = torch.zeros(4, 2, requires_grad=True)
    advantages = torch.tensor([1.0, 2.0, 3.0, 6.0])
    # mean 3, std (n - 1) sqrt((4 + 1 + 0 + 9) / 3): A = (-2, -1, 0, 3) / sqrt(14 / 3)
    normalized = torch.tensor([-2.0, -1.0, 0.0, 3.0]) / math.sqrt(14 / 3)
    values = torch.zeros(4)
    actions = torch.zeros(4, dtype=torch.long)
    old_log_probs = torch.full((4,), math.log(0.5))
    loss, _ = ppo_loss(logits, actions, old_log_probs, advantages, values, values, clip_range=None)
    loss.backward()
    # Ratio 1, action 0, pi = (0.5, 0.5): -(A / 4) * (0.5, -0.5)
    close(logits.grad[:, 0], -normalized / 8)
    close(logits.grad[:, 1], normalized / 8)
    # One sample has no spread: left as it is rather than 0 / 0.
    one, _ = ppo_loss(
        logits[:1], actions[:1], old_log_probs[:1], torch.tensor([3.0]), values[:1], values[:1]
    )
    close(one, torch.tensor(-3.0))


@pytest.mark.parametrize("normalize", [True, False])
def test_ppo_learner_passes_normalize_advantages_on(monkeypatch, normalize):
    from apexrl.algorithms.ppo import learning as ppo
    from apexrl.algorithms.ppo.builder import Settings
    from apexrl.config import LearnerConfig

    seen = []

    def recording(*args, **kwargs):
        seen.append(kwargs["normalize_advantages"])
        return ppo_loss(*args, **kwargs)

    monkeypatch.setattr(ppo, "ppo_loss", recording)
    settings = Settings(epochs=2, minibatches=2, normalize_advantages=normalize)
    config = LearnerConfig(algorithm="ppo", env="CartPole-v1", batch_size=2, algo=settings)
    learning, batch = unroll_learning(config, 2)
    learning.update(batch, torch.ones(2), 1)
    assert seen == [normalize] * 4


def test_a_ratio_past_float_range_gives_finite_gradients():
    """log ratios of a policy far from the batch's (an impala learner's, on unrolls of lagging
    actors): exp would overflow to inf and a clipped step's zero gradient times inf is NaN."""
    from apexrl.algorithms.ppo.losses import clipped_surrogate

    log_ratio = torch.tensor([150.0, 150.0, -150.0, 0.1], requires_grad=True)
    advantages = torch.tensor([1.0, -1.0, 1.0, -1.0])
    for clip in (0.2, None):
        loss = clipped_surrogate(log_ratio, advantages, clip)
        (grad,) = torch.autograd.grad(loss, log_ratio)
        assert torch.isfinite(loss) and torch.isfinite(grad).all()
        # the ordinary step still gets -A r / N
        close(grad[3], torch.tensor(math.exp(0.1) / 4))


def test_time_major_logits_give_the_loss_of_the_flattened_batch():
    """logits [T, B, A] (an unroll) and the same samples as [T * B, A]: the same loss and
    figures, the KL penalty's included, so every reduction over the actions runs over the
    last dimension."""
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 2, 4, generator=generator)
    old_logits = torch.randn(3, 2, 4, generator=generator)
    actions = torch.tensor([[0, 3], [2, 1], [3, 3]])
    old_log_probs = torch.log(torch.tensor([[0.2, 0.3], [0.25, 0.1], [0.4, 0.2]]))
    advantages = torch.tensor([[1.0, -2.0], [0.5, 3.0], [-1.0, 0.0]])
    values = torch.tensor([[0.0, 1.0], [2.0, -1.0], [0.5, 0.5]])
    returns = torch.tensor([[1.0, 1.0], [0.0, 0.0], [2.0, -0.5]])
    samples = (logits, actions, old_log_probs, advantages, values, returns)
    loss, figures = ppo_loss(*samples, ent_coef=0.1, old_logits=old_logits, kl_coef=0.3)
    flat_loss, flat_figures = ppo_loss(
        *(x.reshape(6, *x.shape[2:]) for x in samples),
        ent_coef=0.1,
        old_logits=old_logits.reshape(6, 4),
        kl_coef=0.3,
    )
    close(loss, flat_loss)
    assert set(figures) == set(flat_figures)
    for name, value in flat_figures.items():
        close(figures[name], value)


def test_two_advantages_are_normalized_and_near_equal_ones_stay_small():
    from apexrl.algorithms.ppo.losses import normalized

    # mean 2, std (n - 1) sqrt(2): -1 / sqrt(2), 1 / sqrt(2)
    close(normalized(torch.tensor([1.0, 3.0])), torch.tensor([-1.0, 1.0]) / math.sqrt(2.0))
    # std 1e-8 / sqrt(2): the 1e-8 beside it keeps (A - mean) / std from growing past 1.
    barely = normalized(torch.tensor([0.0, 1e-8], dtype=torch.float64))
    half_gap = 0.5e-8 / (1e-8 / math.sqrt(2.0) + 1e-8)
    torch.testing.assert_close(barely, torch.tensor([-half_gap, half_gap], dtype=torch.float64))


def test_a_ratio_on_the_clip_range_is_not_counted_as_clipped():
    """clip(r, 1 - eps, 1 + eps) = r on the range's edge: with eps 0, ratio 1 is there."""
    logits = torch.tensor([[0.0, 1.0], [2.0, -1.0]])
    actions = torch.tensor([0, 1])
    own = torch.log_softmax(logits, -1).gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    values = torch.zeros(2)
    advantages = torch.tensor([1.0, -1.0])
    _, figures = ppo_loss(logits, actions, own, advantages, values, values, clip_range=0.0)
    close(figures["clip_fraction"], torch.tensor(0.0))


def test_the_figures_are_named_as_the_learner_reports_them():
    args = (torch.zeros(5, 2), ACTIONS, OLD_LOG_PROBS, ADVANTAGES, VALUES_5, RETURNS_5)
    loss, figures = ppo_loss(*args, normalize_advantages=False)
    assert set(figures) == {
        "loss",
        "policy_loss",
        "value_loss",
        "entropy",
        "approx_kl",
        "clip_fraction",
    }
    close(figures["loss"], loss)
