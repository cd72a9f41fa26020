"""C51 (Bellemare et al. 2017): the projected Bellman target against distributions computed by
hand (terminal and out-of-range atoms included), the loss and its priorities, the network."""

import math

import numpy as np
import pytest
import torch
from torch import nn

from apexrl.algorithms.dqn.losses import c51_loss, project_distribution
from apexrl.algorithms.dqn.networks import build_network

SUPPORT = torch.tensor([0.0, 1.0, 2.0, 3.0, 4.0])  # v_min 0, v_max 4, 5 atoms: delta 1


def one_hot(atom: int) -> list[float]:
    return [1.0 if i == atom else 0.0 for i in range(5)]


CASES = [
    # (next distribution, reward, discount, the projected target by hand)
    # 0.5 + 1: halfway between atoms 1 and 2.
    (one_hot(1), 0.5, 1.0, [0, 0.5, 0.5, 0, 0]),
    # 0.25 + 0.5 * 1 = 0.75: a quarter of the way from atom 1 down to atom 0.
    (one_hot(1), 0.25, 0.5, [0.25, 0.75, 0, 0, 0]),
    # Exactly on atom 3: all the mass there, none lost to a zero-width split.
    (one_hot(2), 1.0, 1.0, [0, 0, 0, 1, 0]),
    # A terminal (discount 0): every atom goes to the reward, 2.3 = 0.7 at 2, 0.3 at 3.
    ([0.1, 0.2, 0.3, 0.2, 0.2], 2.3, 0.0, [0, 0, 0.7, 0.3, 0]),
    # Above v_max: 3 + [0..4] = [3, 4, 5, 6, 7] clipped to [3, 4, 4, 4, 4].
    ([0.2] * 5, 3.0, 1.0, [0, 0, 0, 0.2, 0.8]),
    # Below v_min: -3 + 0.5 * [0..4] <= -1, all clipped to atom 0.
    ([0.1, 0.2, 0.3, 0.2, 0.2], -3.0, 0.5, [1, 0, 0, 0, 0]),
    # Contracted: 0.5 * [0, 4] = [0, 2].
    ([0.5, 0, 0, 0, 0.5], 0.0, 0.5, [0.5, 0, 0.5, 0, 0]),
]


@pytest.mark.parametrize("probs, reward, discount, want", CASES)
def test_projection_by_hand(probs, reward, discount, want):
    got = project_distribution(
        torch.tensor([probs]), torch.tensor([reward]), torch.tensor([discount]), SUPPORT
    )
    torch.testing.assert_close(got, torch.tensor([want], dtype=torch.float32))


def test_projection_of_a_batch_keeps_rows_apart_and_mass_whole():
    probs = torch.tensor([case[0] for case in CASES])
    rewards = torch.tensor([case[1] for case in CASES])
    discounts = torch.tensor([case[2] for case in CASES])
    got = project_distribution(probs, rewards, discounts, SUPPORT)
    torch.testing.assert_close(got, torch.tensor([case[3] for case in CASES]))
    torch.testing.assert_close(got.sum(1), torch.ones(len(CASES)))


# A support off 0 whose spacing is not 1, where v_max - v_min, (shifted - v_min) / delta and
# v_min itself each show in the atoms a return lands between.
WIDE = torch.tensor([-10.0, -5.0, 0.0, 5.0, 10.0])  # v_min -10, v_max 10, 5 atoms: delta 5
ODD = torch.tensor([1.0, 3.0, 5.0, 7.0, 9.0])  # v_min 1, v_max 9, 5 atoms: delta 2

OFF_ZERO_CASES = [
    # (support, next distribution, reward, discount, the projected target by hand)
    # 2 + 0.9 * 0 = 2, position (2 - -10) / 5 = 2.4: 0.6 at atom 2 (0), 0.4 at atom 3 (5).
    (WIDE, one_hot(2), 2.0, 0.9, [0, 0, 0.6, 0.4, 0]),
    # -1 + 0.5 * 5 = 1.5, position 11.5 / 5 = 2.3: 0.7 at atom 2, 0.3 at atom 3.
    (WIDE, one_hot(3), -1.0, 0.5, [0, 0, 0.7, 0.3, 0]),
    # -3 + 0.5 * -10 = -8, position 2 / 5 = 0.4: 0.6 at atom 0 (-10), 0.4 at atom 1 (-5).
    (WIDE, one_hot(0), -3.0, 0.5, [0.6, 0.4, 0, 0, 0]),
    # 5 + [-10, -5, 0, 5, 10] = [-5, 0, 5, 10, 15], clipped to 10: atoms 1, 2, 3, 4, 4.
    (WIDE, [0.2] * 5, 5.0, 1.0, [0, 0.2, 0.2, 0.2, 0.4]),
    # A terminal at -7.5, position 2.5 / 5 = 0.5: halfway between atoms 0 and 1.
    (WIDE, [0.1, 0.2, 0.3, 0.2, 0.2], -7.5, 0.0, [0.5, 0.5, 0, 0, 0]),
    # -20 + 0.5 * [-10..10] <= -15: all clipped to atom 0.
    (WIDE, [0.1, 0.2, 0.3, 0.2, 0.2], -20.0, 0.5, [1, 0, 0, 0, 0]),
    # 1 + 3 = 4, position (4 - 1) / 2 = 1.5: halfway between atoms 1 (3) and 2 (5).
    (ODD, one_hot(1), 1.0, 1.0, [0, 0.5, 0.5, 0, 0]),
    # -0.5 + 0.5 * [1, 3, 5, 7, 9] = [0, 1, 2, 3, 4], the 0 clipped up to 1: positions
    # [0, 0, 0.5, 1, 1.5], so 0.2 + 0.2 + 0.1 at atom 0, 0.1 + 0.2 + 0.1 at atom 1, 0.1 at 2.
    (ODD, [0.2] * 5, -0.5, 0.5, [0.5, 0.4, 0.1, 0, 0]),
]


@pytest.mark.parametrize("support, probs, reward, discount, want", OFF_ZERO_CASES)
def test_projection_by_hand_on_supports_off_zero(support, probs, reward, discount, want):
    got = project_distribution(
        torch.tensor([probs]), torch.tensor([reward]), torch.tensor([discount]), support
    )
    torch.testing.assert_close(got, torch.tensor([want], dtype=torch.float32))


class TableDistribution(nn.Module):
    """Logits[s] as a table, [states, actions, atoms]: distributions computable by hand."""

    def __init__(self, logits, support):
        super().__init__()
        self.logits = nn.Parameter(torch.tensor(logits, dtype=torch.float32).log())
        self.register_buffer("support", support)

    def log_probs(self, obs):
        return torch.log_softmax(self.logits[obs.long()], dim=2)

    def forward(self, obs):
        return (self.log_probs(obs).exp() * self.support).sum(2)


def test_loss_and_priorities_by_hand():
    uniform = [0.2] * 5
    # State 0: action 0 uniform, action 1 all at 4. State 1 (next): action 0 all at 1 (Q 1),
    # action 1 all at 2 (Q 2): the online net picks action 1, the target's action 1 is at 3.
    online = TableDistribution([[uniform, one_hot(4)], [one_hot(1), one_hot(2)]], SUPPORT)
    target = TableDistribution([[uniform, uniform], [one_hot(1), one_hot(3)]], SUPPORT)
    online.logits.data.clamp_(min=-30.0)
    target.logits.data.clamp_(min=-30.0)
    batch = {
        "obs": torch.tensor([0, 0]),
        "action": torch.tensor([0, 0]),
        "reward": torch.tensor([0.5, 1.0]),
        "discount": torch.tensor([0.5, 0.0]),
        "next_obs": torch.tensor([1, 1]),
    }
    weights = torch.tensor([1.0, 2.0])
    loss, kl, q = c51_loss(online, target, batch, weights)
    # Targets: 0.5 + 0.5 * 3 = 2 (all at atom 2); terminal 1 (all at atom 1). The online
    # distribution of (0, 0) is uniform: cross-entropy log 5, KL log 5 (targets have no entropy).
    torch.testing.assert_close(loss, torch.tensor((1.0 + 2.0) * math.log(5) / 2))
    torch.testing.assert_close(kl, torch.tensor([math.log(5)] * 2))
    torch.testing.assert_close(q, torch.tensor([2.0, 2.0]))
    assert not kl.requires_grad and not q.requires_grad
    loss.backward()
    assert target.logits.grad is None
    # The gradient moves only the logits of (state 0, action 0), toward the target atoms.
    grad = online.logits.grad
    assert grad[1].abs().sum() == 0 and grad[0, 1].abs().sum() == 0
    assert grad[0, 0, 2] < 0 and grad[0, 0, 1] < 0 and grad[0, 0, 4] > 0


def test_the_online_network_picks_the_next_action_and_the_target_values_it():
    """Double Q where the two networks disagree: at the next state the online net prefers
    action 1 (Q 2 over 1), the target net action 0 (Q 4 over 3). The target distribution is
    the target's of action 1, all at 3: 0.5 + 0.5 * 3 = 2 (atom 2), not 0.5 + 0.5 * 4 = 2.5."""
    uniform = [0.2] * 5
    online = TableDistribution([[uniform, uniform], [one_hot(1), one_hot(2)]], SUPPORT)
    target = TableDistribution([[uniform, uniform], [one_hot(4), one_hot(3)]], SUPPORT)
    online.logits.data.clamp_(min=-30.0)
    target.logits.data.clamp_(min=-30.0)
    assert online(torch.tensor([1])).argmax() == 1 and target(torch.tensor([1])).argmax() == 0
    batch = {
        "obs": torch.tensor([0]),
        "action": torch.tensor([1]),
        "reward": torch.tensor([0.5]),
        "discount": torch.tensor([0.5]),
        "next_obs": torch.tensor([1]),
    }
    loss, kl, _ = c51_loss(online, target, batch, torch.ones(1))
    # Against a uniform prediction, -sum m log p = log 5 for any target m; the gradient says
    # where the target's mass is: it pulls up atom 2's logit alone.
    torch.testing.assert_close(kl, torch.tensor([math.log(5)]))
    loss.backward()
    grad = online.logits.grad[0, 1]
    assert grad[2] < 0 and (grad[[0, 1, 3, 4]] > 0).all()
    torch.testing.assert_close(grad, torch.tensor([0.2, 0.2, -0.8, 0.2, 0.2]))


def test_priorities_vanish_when_the_distributions_agree():
    online = TableDistribution([[one_hot(2)], [one_hot(2)]], SUPPORT)
    online.logits.data.clamp_(min=-30.0)
    batch = {
        "obs": torch.tensor([0]),
        "action": torch.tensor([0]),
        "reward": torch.tensor([2.0]),
        "discount": torch.tensor([0.0]),
        "next_obs": torch.tensor([1]),
    }
    _, kl, _ = c51_loss(online, online, batch, torch.ones(1))
    assert kl.item() < 1e-6


def test_network_distributions_and_expected_q():
    torch.manual_seed(0)
    net = build_network((4,), np.float32, 3, (16,), atoms=51, v_min=-10.0, v_max=10.0)
    obs = torch.randn(5, 4)
    log_probs = net.log_probs(obs)
    assert log_probs.shape == (5, 3, 51)
    torch.testing.assert_close(log_probs.exp().sum(2), torch.ones(5, 3))
    torch.testing.assert_close(net(obs), (log_probs.exp() * torch.linspace(-10, 10, 51)).sum(2))
    # The support is derived from the settings, never published.
    assert "support" not in net.state_dict()


@pytest.mark.parametrize(
    "options, setting",
    [({"atoms": 1}, "atoms"), ({"atoms": 51, "v_min": 1.0, "v_max": 1.0}, "v_min")],
)
def test_bad_support_refused(options, setting):
    with pytest.raises(ValueError, match=setting):
        build_network((4,), np.float32, 2, (8,), **options)


def test_priorities_are_the_kl_not_the_cross_entropy():
    """A target with entropy tells the KL (the priority) from the cross-entropy (the loss)."""
    uniform = [0.2] * 5
    peaked = [0.1, 0.2, 0.4, 0.2, 0.1]
    online = TableDistribution([[uniform], [peaked]], SUPPORT)
    batch = {
        "obs": torch.tensor([0, 1]),
        "action": torch.tensor([0, 0]),
        # Terminals at 2.5: the target m is half at atom 2, half at atom 3, for both items.
        "reward": torch.tensor([2.5, 2.5]),
        "discount": torch.tensor([0.0, 0.0]),
        "next_obs": torch.tensor([0, 0]),
    }
    loss, kl, _ = c51_loss(online, online, batch, torch.ones(2))
    # Cross-entropy -sum m log p: uniform 0.5 * log 5 * 2 = log 5; peaked
    # -0.5 log 0.4 - 0.5 log 0.2 = 0.5 log 12.5.
    torch.testing.assert_close(loss, torch.tensor((math.log(5) + 0.5 * math.log(12.5)) / 2))
    # KL sum m (log m - log p): uniform 2 * 0.5 * log(0.5 / 0.2) = log 2.5; peaked
    # 0.5 log(0.5 / 0.4) + 0.5 log(0.5 / 0.2) = 0.5 log 3.125.
    torch.testing.assert_close(kl, torch.tensor([math.log(2.5), 0.5 * math.log(3.125)]))
