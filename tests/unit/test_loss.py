import pytest
import torch
from torch import nn

from apexrl.algorithms.dqn.losses import dqn_loss, td_targets
from apexrl.algorithms.dqn.networks import build_network


class TableQ(nn.Module):
    """Q(s, .) = table[s]: fixed Q tables make every target computable by hand."""

    def __init__(self, table):
        super().__init__()
        self.table = nn.Parameter(torch.tensor(table, dtype=torch.float32))

    def forward(self, obs):
        return self.table[obs.long()]


# Next state 1 is where double DQN differs from plain DQN: the online net picks
# action 0 (3 > 0), the target net values it at 30, although its own max is 40.
ONLINE = [[1.0, 2.0], [3.0, 0.0], [0.0, 5.0]]
TARGET = [[10.0, 20.0], [30.0, 40.0], [50.0, 60.0]]


def make_batch():
    return {
        "obs": torch.tensor([0, 0, 2]),
        "action": torch.tensor([1, 0, 0]),
        "reward": torch.tensor([1.0, 2.0, 0.5]),
        "discount": torch.tensor([0.5, 0.0, 0.0]),
        "next_obs": torch.tensor([1, 2, 2]),
    }


def test_targets_use_online_argmax_and_target_value():
    online, target = TableQ(ONLINE), TableQ(TARGET)
    b = make_batch()
    y = td_targets(online, target, b["reward"], b["discount"], b["next_obs"])
    # 1 + 0.5 * 30 (not 0.5 * 40); discount 0 cuts the bootstrap entirely.
    torch.testing.assert_close(y, torch.tensor([16.0, 2.0, 0.5]))
    assert not y.requires_grad


def test_one_net_as_online_and_target_is_one_pass_over_next_obs():
    """An actor's priorities (Ape-X: its net is both): max_a Q(s', a), from one pass."""
    net, calls = TableQ(ONLINE), []
    net.register_forward_hook(lambda module, args, out: calls.append(args[0]))
    b = make_batch()
    y = td_targets(net, net, b["reward"], b["discount"], b["next_obs"])
    torch.testing.assert_close(y, torch.tensor([1 + 0.5 * 3.0, 2.0, 0.5]))
    assert len(calls) == 1


def test_loss_and_td_errors_by_hand():
    online, target = TableQ(ONLINE), TableQ(TARGET)
    weights = torch.tensor([1.0, 0.5, 2.0])
    loss, td, _ = dqn_loss(online, target, make_batch(), weights)
    # q = [2, 1, 0], y = [16, 2, 0.5] -> td = [14, 1, 0.5]
    torch.testing.assert_close(td, torch.tensor([14.0, 1.0, 0.5]))
    assert td.shape == (3,) and not td.requires_grad
    # Huber: 14 - 0.5 (linear part), 0.5 * 1^2, 0.5 * 0.5^2; weighted, then mean over 3.
    torch.testing.assert_close(loss, torch.tensor((13.5 * 1.0 + 0.5 * 0.5 + 0.125 * 2.0) / 3))

    loss.backward()
    # Gradient only reaches Q(obs, action) of the online net: nothing flows through y.
    want = torch.zeros(3, 2)
    want[0, 1] = -1.0 * 1.0 / 3  # clipped Huber slope
    want[0, 0] = -1.0 * 0.5 / 3
    want[2, 0] = -0.5 * 2.0 / 3
    torch.testing.assert_close(online.table.grad, want)
    assert target.table.grad is None


def test_weights_scale_the_loss():
    online, target = TableQ(ONLINE), TableQ(TARGET)
    ones = torch.ones(3)
    loss1, td1, _ = dqn_loss(online, target, make_batch(), ones)
    loss3, td3, _ = dqn_loss(online, target, make_batch(), 3 * ones)
    torch.testing.assert_close(loss3, 3 * loss1)
    torch.testing.assert_close(td1, td3)
    zero_first = torch.tensor([0.0, 1.0, 1.0])
    loss_z, _, _ = dqn_loss(online, target, make_batch(), zero_first)
    torch.testing.assert_close(loss_z, torch.tensor((0.5 + 0.125) / 3))


@pytest.mark.parametrize("batch_size", [1, 5])
def test_loss_with_real_network_trains(batch_size):
    torch.manual_seed(0)
    online = build_network((4,), "float32", 2, hidden=(16,))
    target = build_network((4,), "float32", 2, hidden=(16,))
    target.load_state_dict(online.state_dict())
    batch = {
        "obs": torch.randn(batch_size, 4),
        "action": torch.randint(0, 2, (batch_size,)),
        "reward": torch.ones(batch_size),
        "discount": torch.full((batch_size,), 0.9),
        "next_obs": torch.randn(batch_size, 4),
    }
    loss, td, _ = dqn_loss(online, target, batch, torch.ones(batch_size))
    assert loss.shape == () and td.shape == (batch_size,)
    loss.backward()
    assert all(p.grad is not None for p in online.parameters())
    assert all(p.grad is None for p in target.parameters())
