import numpy as np
import pytest
import torch

from apexrl.algorithms.dqn.networks import build_network
from apexrl.algorithms.networks import load_numpy_state, state_to_numpy


def test_mlp_dueling_shapes_and_identity():
    torch.manual_seed(0)
    net = build_network((4,), np.float32, num_actions=3)
    obs = torch.randn(5, 4)
    q = net(obs)
    assert q.shape == (5, 3)
    # Dueling: the mean over actions of Q is exactly V.
    value = net.value(net.torso(obs)).squeeze(1)
    torch.testing.assert_close(q.mean(dim=1), value)
    # float64 obs (some gymnasium envs) are accepted.
    torch.testing.assert_close(net(obs.double()), q)


def test_hidden_sizes_are_configurable():
    net = build_network((6,), "float64", num_actions=2, hidden=(32, 16, 8))
    widths = [m.out_features for m in net.torso.modules() if isinstance(m, torch.nn.Linear)]
    assert widths == [32, 16, 8]
    assert net(torch.zeros(1, 6)).shape == (1, 2)


def test_conv_dueling_shapes():
    torch.manual_seed(0)
    net = build_network((4, 84, 84), np.uint8, num_actions=6)
    obs = torch.randint(0, 256, (2, 4, 84, 84), dtype=torch.uint8)
    q = net(obs)
    assert q.shape == (2, 6)
    value = net.value(net.torso(obs)).squeeze(1)
    torch.testing.assert_close(q.mean(dim=1), value)
    assert net.torso.convs[0].in_channels == 4  # channels-last input permuted


def test_rejects_unsupported_observations():
    with pytest.raises(ValueError, match="obs_shape"):
        build_network((84, 84), np.uint8, 4)
    with pytest.raises(ValueError, match="obs_shape"):
        build_network((4, 84, 84), np.float32, 4)


@pytest.mark.parametrize("obs_shape, dtype", [((4,), np.float32), ((2, 36, 36), np.uint8)])
def test_numpy_state_round_trip_gives_identical_outputs(obs_shape, dtype):
    torch.manual_seed(1)
    src = build_network(obs_shape, dtype, 4)
    torch.manual_seed(2)
    dst = build_network(obs_shape, dtype, 4)
    obs = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (3, *obs_shape)).astype(dtype))
    assert not torch.equal(src(obs), dst(obs))

    arrays = state_to_numpy(src)
    assert list(arrays) == list(src.state_dict())
    for a in arrays.values():
        assert a.dtype == np.float32 and a.flags.c_contiguous
    # As they arrive over gRPC: read-only views on raw bytes.
    wire = {k: np.frombuffer(a.tobytes(), np.float32).reshape(a.shape) for k, a in arrays.items()}
    load_numpy_state(dst, wire)
    torch.testing.assert_close(dst(obs), src(obs), rtol=0, atol=0)


def test_snapshot_does_not_alias_live_weights():
    net = build_network((4,), np.float32, 2)
    arrays = state_to_numpy(net)
    before = arrays["value.bias"].copy()
    with torch.no_grad():
        net.value.bias.add_(1.0)
    np.testing.assert_array_equal(arrays["value.bias"], before)


def test_load_rejects_mismatched_names():
    net = build_network((4,), np.float32, 2)
    arrays = state_to_numpy(net)
    arrays.pop("value.bias")
    arrays["bogus"] = np.zeros(1, np.float32)
    with pytest.raises(ValueError, match="missing \\['value.bias'\\].*unexpected \\['bogus'\\]"):
        load_numpy_state(net, arrays)
