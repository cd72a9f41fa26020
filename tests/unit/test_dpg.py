"""Ape-X DPG: losses by hand, the acting policy, the update step, checkpoints, the registry."""

import copy
import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from apexrl.algorithms.base import nstep_columns
from apexrl.algorithms.dpg.acting import DPGPolicy
from apexrl.algorithms.dpg.builder import DPGBuilder as DPG
from apexrl.algorithms.dpg.builder import Settings
from apexrl.algorithms.dpg.learning import POLICY_GRAD_CLIP, DPGLearning
from apexrl.algorithms.dpg.losses import critic_loss, critic_targets, policy_loss
from apexrl.algorithms.dpg.networks import build_actor_critic
from apexrl.algorithms.envs import EnvSpec
from apexrl.algorithms.exploration import noise_ladder

LOW, HIGH = np.array([-2.0], np.float32), np.array([2.0], np.float32)


def linear_nets(policy_weight, policy_bias, critic_weight, critic_bias):
    """No hidden layers, so by hand: pi(s) = 2 tanh(w s + b) on [-2, 2], Q(s, a) = u.[s, a] + c."""
    nets = build_actor_critic((1,), np.float32, LOW, HIGH, hidden=())
    with torch.no_grad():
        nets.policy.head.weight.fill_(policy_weight)
        nets.policy.head.bias.fill_(policy_bias)
        nets.critic.head.weight.copy_(torch.tensor([critic_weight]))
        nets.critic.head.bias.fill_(critic_bias)
    return nets


# Online critic Q = 2 s + 3 a. Target: pi_t(s) = 2 tanh(atanh(0.5)) = 1 whatever s, and
# Q_t(s, a) = s - a + 0.5, so Q_t(s', pi_t(s')) = s' - 0.5.
def online_and_target():
    return linear_nets(0.5, 0.0, [2.0, 3.0], 0.0), linear_nets(
        0.0, math.atanh(0.5), [1.0, -1.0], 0.5
    )


def make_batch(obs_dtype=torch.float32):
    return {
        "obs": torch.tensor([[1.0], [2.0], [-1.0]], dtype=obs_dtype),
        "action": torch.tensor([[0.5], [-1.0], [1.0]]),
        "reward": torch.tensor([1.0, 0.0, 2.0]),
        "discount": torch.tensor([0.9, 0.5, 0.0]),
        "next_obs": torch.tensor([[2.0], [4.0], [3.0]], dtype=obs_dtype),
    }


def test_critic_targets_by_hand():
    _, target = online_and_target()
    b = make_batch()
    y = critic_targets(target.policy, target.critic, b["reward"], b["discount"], b["next_obs"])
    # r + d * (s' - 0.5); discount 0 (a terminal) cuts the bootstrap.
    torch.testing.assert_close(y, torch.tensor([1 + 0.9 * 1.5, 0 + 0.5 * 3.5, 2.0]))
    assert not y.requires_grad


def test_critic_loss_td_errors_and_gradients_by_hand():
    online, target = online_and_target()
    weights = torch.tensor([1.0, 0.5, 2.0])
    loss, td, q = critic_loss(online.critic, target.policy, target.critic, make_batch(), weights)
    # q = 2 s + 3 a = [3.5, 1, 1]; y = [2.35, 1.75, 2] -> td = y - q.
    torch.testing.assert_close(q, torch.tensor([3.5, 1.0, 1.0]))
    torch.testing.assert_close(td, torch.tensor([-1.15, 0.75, 1.0]))
    assert td.shape == (3,) and not td.requires_grad
    # Weighted 0.5 * td^2, mean over the batch.
    want = (1.0 * 0.5 * 1.15**2 + 0.5 * 0.5 * 0.75**2 + 2.0 * 0.5 * 1.0**2) / 3
    torch.testing.assert_close(loss, torch.tensor(want))

    loss.backward()
    # dL/du = mean(w * (q - y) * [s, a]); nothing reaches the targets.
    grad_s = (1.0 * 1.15 * 1 + 0.5 * -0.75 * 2 + 2.0 * -1.0 * -1) / 3
    grad_a = (1.0 * 1.15 * 0.5 + 0.5 * -0.75 * -1 + 2.0 * -1.0 * 1) / 3
    torch.testing.assert_close(online.critic.head.weight.grad, torch.tensor([[grad_s, grad_a]]))
    torch.testing.assert_close(
        online.critic.head.bias.grad, torch.tensor([(1.15 - 0.5 * 0.75 - 2.0) / 3])
    )
    assert all(p.grad is None for p in target.parameters())


def test_critic_casts_float64_observations():
    online, target = online_and_target()
    ones = torch.ones(3)
    _, td32, _ = critic_loss(online.critic, target.policy, target.critic, make_batch(), ones)
    batch64 = make_batch(torch.float64)
    _, td64, _ = critic_loss(online.critic, target.policy, target.critic, batch64, ones)
    assert td64.dtype == torch.float32
    torch.testing.assert_close(td32, td64)


def test_policy_loss_and_gradient_closed_form():
    online, _ = online_and_target()
    obs = torch.tensor([[1.0], [2.0], [-1.0]])
    loss = policy_loss(online.policy, online.critic, obs)
    # pi(s) = 2 tanh(0.5 s); loss = -mean(2 s + 3 pi(s)).
    s = [1.0, 2.0, -1.0]
    want = -sum(2 * x + 3 * 2 * math.tanh(0.5 * x) for x in s) / 3
    torch.testing.assert_close(loss, torch.tensor(want))
    loss.backward()
    # d/dw of -3 * 2 tanh(w s + b) at w = 0.5, b = 0: -6 (1 - tanh^2) s, averaged.
    grad_w = -sum(6 * (1 - math.tanh(0.5 * x) ** 2) * x for x in s) / 3
    grad_b = -sum(6 * (1 - math.tanh(0.5 * x) ** 2) for x in s) / 3
    torch.testing.assert_close(online.policy.head.weight.grad, torch.tensor([[grad_w]]))
    torch.testing.assert_close(online.policy.head.bias.grad, torch.tensor([grad_b]))


def test_policy_head_is_scaled_to_the_bounds():
    low, high = np.array([-1.0, 0.0, -3.0], np.float32), np.array([1.0, 2.0, 3.0], np.float32)
    nets = build_actor_critic((4,), np.float64, low, high, hidden=(8,))
    with torch.no_grad():
        nets.policy.head.weight.zero_()
        nets.policy.head.bias.copy_(torch.tensor([math.atanh(0.5), 0.0, -100.0]))
        actions = nets.policy(torch.randn(5, 4, dtype=torch.float64))
    # center + half_range * tanh(bias): 0 + 1 * 0.5, 1 + 1 * 0, 0 + 3 * (-1) (saturated).
    assert actions.shape == (5, 3) and actions.dtype == torch.float32
    torch.testing.assert_close(actions, torch.tensor([[0.5, 1.0, -3.0]]).expand(5, 3))
    # The bounds are constants of the env, not published weights.
    assert all(name.startswith(("policy.", "critic.")) for name in nets.state_dict())
    assert not any("center" in name or "half_range" in name for name in nets.state_dict())


# --- the acting policy ----------------------------------------------------------------------


def box_spec(low=(-1.0, 0.0, -3.0), high=(1.0, 2.0, 3.0), obs_dim=4):
    low, high = np.array(low, np.float32), np.array(high, np.float32)
    return EnvSpec("Box-v0", (obs_dim,), np.dtype(np.float64), 0, low.shape, low, high)


def agent_config(hidden="16,16", target_update_interval=2):
    settings = Settings(target_update_interval=target_update_interval)
    return SimpleNamespace(algorithm="dpg", env="Box-v0", hidden=hidden, gamma=0.99, algo=settings)


def learner_config():
    return SimpleNamespace(learning_rate=1e-3, max_grad_norm=10.0)


def test_actions_in_bounds_and_exploration_zero_is_deterministic():
    spec = box_spec()
    policy = DPG(agent_config(), spec).policy()
    obs = np.random.default_rng(0).normal(size=(64, 4)) * 10
    for scale in (0.05, 0.5, 3.0):
        actions = policy.act(obs, scale, np.random.default_rng(1))
        assert actions.shape == (64, 3) and actions.dtype == np.float32
        assert (actions >= spec.action_low).all() and (actions <= spec.action_high).all()
    greedy = policy.act(obs, 0.0, np.random.default_rng(1))
    np.testing.assert_array_equal(greedy, policy.act(obs, 0.0, np.random.default_rng(2)))
    with torch.no_grad():
        np.testing.assert_array_equal(greedy, policy.nets.policy(torch.from_numpy(obs)).numpy())


def test_noise_std_is_exploration_times_half_range():
    spec = box_spec()
    policy = DPG(agent_config(), spec).policy()
    with torch.no_grad():  # pi(s) = the center of the box, so clipping (10 std away) never bites
        policy.nets.policy.head.weight.zero_()
        policy.nets.policy.head.bias.zero_()
    obs = np.zeros((20_000, 4))
    actions = policy.act(obs, 0.1, np.random.default_rng(0))
    center, half_range = (
        (spec.action_high + spec.action_low) / 2,
        (spec.action_high - spec.action_low) / 2,
    )
    # 20k draws: the std estimate is within ~1.5% (3 sigma), the mean within 0.03 std.
    np.testing.assert_allclose(actions.std(axis=0), 0.1 * half_range, rtol=0.03)
    np.testing.assert_allclose(actions.mean(axis=0), center, atol=0.03 * 0.1 * half_range.max())


def test_priorities_are_td_errors_with_the_actor_nets_as_targets():
    # pi(s) = 1 everywhere, Q = 2 s + 3 a: |r + d * Q(s', 1) - Q(s, a)| by hand.
    policy = DPGPolicy(linear_nets(0.0, math.atanh(0.5), [2.0, 3.0], 0.0), LOW, HIGH)
    columns = {name: t.numpy() for name, t in make_batch(torch.float64).items()}
    priorities = policy.priorities(columns)
    # Q(s', 1) = [7, 11, 9]; y = [1 + 0.9 * 7, 0 + 0.5 * 11, 2]; Q(s, a) = [3.5, 1, 1].
    np.testing.assert_allclose(priorities, [3.8, 4.5, 1.0], rtol=1e-6)
    assert priorities.dtype == np.float32 and priorities.shape == (3,)


# --- learning ---------------------------------------------------------------------------------


def random_batch(spec, size, seed):
    g = torch.Generator().manual_seed(seed)
    return {
        "obs": torch.randn(size, *spec.obs_shape, generator=g, dtype=torch.float64),
        "action": torch.rand(size, *spec.action_shape, generator=g) * 2 - 1,
        "reward": torch.randn(size, generator=g) * 10,
        "discount": torch.full((size,), 0.9),
        "next_obs": torch.randn(size, *spec.obs_shape, generator=g, dtype=torch.float64),
    }


def make_learning(target_update_interval=2, seed=0) -> tuple[DPG, DPGLearning]:
    torch.manual_seed(seed)
    algorithm = DPG(agent_config(target_update_interval=target_update_interval), box_spec())
    return algorithm, algorithm.learning(learner_config(), torch.device("cpu"))


def test_update_returns_td_errors_figures_and_leaves_policy_step_off_the_critic():
    algorithm, learning = make_learning(target_update_interval=1000)
    batch, weights = random_batch(algorithm.spec, 8, seed=1), torch.rand(8)
    online, target = copy.deepcopy(learning.online), copy.deepcopy(learning.target)
    _, want_td, _ = critic_loss(online.critic, target.policy, target.critic, batch, weights)

    td, figures = learning.update(batch, weights, step=1)

    torch.testing.assert_close(td, want_td.abs())
    assert td.shape == (8,) and not td.requires_grad
    assert set(figures) == {"loss", "q_mean", "policy_loss"}
    assert all(isinstance(v, float) for v in figures.values())
    # The critic moved exactly as its own step alone moves it: the policy loss, which
    # back-propagates through the critic, left its weights alone.
    optimizer = torch.optim.Adam(online.critic.parameters(), lr=1e-3)
    loss, _, _ = critic_loss(online.critic, target.policy, target.critic, batch, weights)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(online.critic.parameters(), 10.0)
    optimizer.step()
    want = online.critic.state_dict()
    for name, got in learning.online.critic.state_dict().items():
        torch.testing.assert_close(got, want[name], msg=name)
    assert all(p.requires_grad for p in learning.online.parameters())
    assert not any(
        torch.equal(a, b)
        for a, b in zip(
            learning.online.policy.parameters(), online.policy.parameters(), strict=True
        )
    )


def test_policy_gradients_are_clipped_elementwise():
    algorithm, learning = make_learning()
    with torch.no_grad():  # a steep critic: raw policy gradients far beyond the clip
        learning.online.critic.head.weight.mul_(1000.0)
    learning.update(random_batch(algorithm.spec, 8, seed=2), torch.ones(8), step=1)
    grads = torch.cat([p.grad.flatten() for p in learning.online.policy.parameters()])
    assert grads.abs().max() == POLICY_GRAD_CLIP


def test_targets_sync_every_interval():
    algorithm, learning = make_learning(target_update_interval=2)
    initial = {k: v.clone() for k, v in learning.target.state_dict().items()}
    learning.update(random_batch(algorithm.spec, 8, seed=3), torch.ones(8), step=1)
    for name, value in learning.target.state_dict().items():
        torch.testing.assert_close(value, initial[name], msg=name)
    learning.update(random_batch(algorithm.spec, 8, seed=4), torch.ones(8), step=2)
    for name, value in learning.target.state_dict().items():
        torch.testing.assert_close(value, learning.online.state_dict()[name], msg=name)


def perturbed_apart(learning: DPGLearning, seed: int) -> None:
    """Moves the target networks away from the online ones, as updates between syncs do."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in learning.target.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.5)


def test_the_critic_bootstraps_from_the_target_policy_and_target_critic():
    """With the targets moved apart from the online networks, the update's TD errors are those
    of y = r + d Q_target(s', pi_target(s')): not of the online policy's next action."""
    algorithm, learning = make_learning(target_update_interval=1000)
    perturbed_apart(learning, seed=6)
    batch, weights = random_batch(algorithm.spec, 8, seed=7), torch.ones(8)
    online, target = copy.deepcopy(learning.online), copy.deepcopy(learning.target)
    _, want, _ = critic_loss(online.critic, target.policy, target.critic, batch, weights)
    _, online_next, _ = critic_loss(online.critic, online.policy, target.critic, batch, weights)
    assert not torch.allclose(want, online_next, rtol=1e-3, atol=1e-3)  # the check can tell

    td, _ = learning.update(batch, weights, step=1)

    torch.testing.assert_close(td, want.abs())


class ReferenceDDPG:
    """DDPG's update written out from its equations, for the learner's to equal: the critic
    regresses to y = r + d Q'(s', pi'(s')) (importance-weighted 0.5 delta^2, norm-clipped), the
    policy then climbs Q(s, pi(s)) on the updated critic (gradients clipped to [-1, 1]), and
    the targets copy both every `interval` updates."""

    def __init__(self, learning: DPGLearning, interval: int):
        self.online, self.target = copy.deepcopy(learning.online), copy.deepcopy(learning.target)
        self.interval = interval
        self.critic_adam = torch.optim.Adam(self.online.critic.parameters(), lr=1e-3)
        self.policy_adam = torch.optim.Adam(self.online.policy.parameters(), lr=1e-3)

    def update(self, b, weights, step: int) -> torch.Tensor:
        online, target = self.online, self.target
        with torch.no_grad():
            next_obs = b["next_obs"].float()
            y = b["reward"] + b["discount"] * target.critic(next_obs, target.policy(next_obs))
        delta = y - online.critic(b["obs"].float(), b["action"])
        self.critic_adam.zero_grad()
        (weights * 0.5 * delta**2).mean().backward()
        torch.nn.utils.clip_grad_norm_(online.critic.parameters(), 10.0)
        self.critic_adam.step()
        self.policy_adam.zero_grad()
        obs = b["obs"].float()
        (-online.critic(obs, online.policy(obs)).mean()).backward()
        for p in online.policy.parameters():
            p.grad.clamp_(-1.0, 1.0)
        self.policy_adam.step()
        if step % self.interval == 0:
            target.load_state_dict(online.state_dict())
        return delta.detach().abs()


def test_updates_equal_ddpg_written_out_from_its_equations():
    """The deterministic check beside the integration test's statistical one: five updates
    (a steep critic so the policy's clip binds, targets apart from the online networks, a sync
    after the second and fourth) leave every network and TD error as the reference's."""
    algorithm, learning = make_learning(target_update_interval=2)
    with torch.no_grad():
        learning.online.critic.head.weight.mul_(30.0)
    perturbed_apart(learning, seed=8)
    reference = ReferenceDDPG(learning, interval=2)
    for step in range(1, 6):
        batch = random_batch(algorithm.spec, 16, seed=20 + step)
        weights = torch.rand(16, generator=torch.Generator().manual_seed(step)) + 0.1
        td, _ = learning.update(batch, weights, step)
        torch.testing.assert_close(td, reference.update(batch, weights, step), msg=f"step {step}")
    for nets, want in ((learning.online, reference.online), (learning.target, reference.target)):
        for name, value in nets.state_dict().items():
            torch.testing.assert_close(value, want.state_dict()[name], msg=name)
    assert not torch.equal(learning.online.policy.head.weight, learning.target.policy.head.weight)


def test_published_parameters_hold_policy_and_critic_and_load_into_a_policy():
    algorithm, learning = make_learning()
    learning.update(random_batch(algorithm.spec, 8, seed=5), torch.ones(8), step=1)
    params = learning.parameters()
    assert {name.split(".")[0] for name in params} == {"policy", "critic"}
    assert all(a.dtype == np.float32 and a.flags.c_contiguous for a in params.values())
    policy = algorithm.policy()
    policy.load(params)
    obs = np.random.default_rng(0).normal(size=(4, 4))
    with torch.no_grad():
        want = learning.online.policy(torch.from_numpy(obs)).numpy()
    np.testing.assert_array_equal(policy.act(obs, 0.0, np.random.default_rng(0)), want)


def test_state_round_trips_exactly():
    algorithm, learning = make_learning(target_update_interval=2)
    for step in (1, 2, 3):  # online != target after step 3; both optimizers have state
        learning.update(random_batch(algorithm.spec, 8, seed=step), torch.ones(8), step)
    arrays, meta = learning.state()
    prefixes = {name.split("/")[0] for name in arrays}
    assert prefixes == {"online", "target", "critic_optimizer", "policy_optimizer"}
    assert {k[len("online/") :] for k in arrays if k.startswith("online/")} == set(
        learning.parameters()
    )
    meta = json.loads(json.dumps(meta))  # as a checkpoint stores it

    _, restored = make_learning(target_update_interval=2, seed=99)
    restored.load_state({k: v.copy() for k, v in arrays.items()}, meta)
    arrays2, meta2 = restored.state()
    assert json.loads(json.dumps(meta2)) == meta and arrays2.keys() == arrays.keys()
    for name in arrays:
        np.testing.assert_array_equal(arrays2[name], arrays[name], err_msg=name)

    # ... and both go on identically.
    batch = random_batch(algorithm.spec, 8, seed=10)
    td1, _ = learning.update(batch, torch.ones(8), 4)
    td2, _ = restored.update(batch, torch.ones(8), 4)
    torch.testing.assert_close(td1, td2, rtol=0, atol=0)
    after = restored.parameters()
    for name, value in learning.parameters().items():
        np.testing.assert_array_equal(after[name], value, err_msg=name)


# --- the algorithm --------------------------------------------------------------------------


def test_columns_carry_float32_actions_of_the_env_shape():
    spec = box_spec()
    columns = DPG(agent_config(), spec).columns()
    assert columns == nstep_columns(spec, np.dtype(np.float32))
    action = {c.name: c for c in columns}["action"]
    assert (action.dtype, action.shape) == (np.float32, (3,))


def test_discrete_env_rejected():
    spec = EnvSpec("CartPole-v1", (4,), np.dtype(np.float32), 2, (), None, None)
    with pytest.raises(ValueError, match=r"dpg needs a continuous \(Box\).*algorithm = dqn"):
        DPG(agent_config(), spec)


def test_registry_makes_dpg_for_a_box_env():
    from apexrl.algorithms import make

    algorithm = make(SimpleNamespace(algorithm="dpg", env="Pendulum-v1", hidden="8", algo=None))
    assert isinstance(algorithm, DPG)
    assert algorithm.name == "dpg" and algorithm.metrics.exploration == "noise_scale"


def test_noise_ladder():
    assert noise_ladder(0, 8) == pytest.approx(0.5)
    assert noise_ladder(7, 8) == pytest.approx(0.05)
    assert noise_ladder(1, 3) == pytest.approx(math.sqrt(0.5 * 0.05))
    assert noise_ladder(1, 5) == pytest.approx(0.5 * 0.1**0.25)  # geometric: ratio 0.1 over 4
    assert noise_ladder(0, 1) == pytest.approx(math.sqrt(0.5 * 0.05))
    assert (np.diff([noise_ladder(i, 16) for i in range(16)]) < 0).all()
    algorithm = DPG(agent_config(), box_spec())
    assert [algorithm.exploration(i, 5) for i in range(5)] == [noise_ladder(i, 5) for i in range(5)]
