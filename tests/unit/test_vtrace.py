"""V-trace and the IMPALA loss against numbers worked out by hand (gamma 0.9 unless said)."""

import math

import pytest
import torch

from apexrl.algorithms.impala.builder import Settings
from apexrl.algorithms.impala.vtrace import VTrace, impala_loss, vtrace
from tests.conftest import unroll_learning


def column(*values):
    """[T, 1]: one env's unroll."""
    return torch.tensor(values, dtype=torch.float32).unsqueeze(1)


def close(actual, expected):
    torch.testing.assert_close(actual, expected, rtol=1e-6, atol=1e-6)


def test_on_policy_targets_are_nstep_returns_and_termination_cuts_them():
    # Env 0 runs through the unroll; env 1 terminates at step 1 and restarts at step 2.
    log_probs = torch.log(torch.tensor([[0.5, 0.2], [0.25, 0.9], [1.0, 0.1]]))
    rewards = torch.tensor([[1.0, 1.0], [2.0, 1.0], [3.0, 1.0]])
    discounts = torch.tensor([[0.9, 0.5], [0.9, 0.0], [0.9, 0.5]])
    values = torch.tensor([[0.5, 2.0], [1.0, 4.0], [1.5, 8.0]])
    bootstrap = torch.tensor([2.0, 10.0])
    out = vtrace(log_probs, log_probs, rewards, discounts, values, bootstrap)
    # rhos = c = 1: v_s is the return bootstrapped with V(x_T), whatever V(x_s) is.
    # env 0: v2 = 3 + 0.9 * 2 = 4.8, v1 = 2 + 0.9 * 4.8 = 6.32, v0 = 1 + 0.9 * 6.32 = 6.688
    # env 1: v2 = 1 + 0.5 * 10 = 6, v1 = 1 + 0 * 6 = 1, v0 = 1 + 0.5 * 1 = 1.5
    close(out.vs, torch.tensor([[6.688, 1.5], [6.32, 1.0], [4.8, 6.0]]))
    # pg advantage r_t + discount_t * v_{t+1} - V(x_t), v_T = V(x_T):
    # env 0: 1 + 0.9 * 6.32 - 0.5 = 6.188, 2 + 0.9 * 4.8 - 1 = 5.32, 3 + 0.9 * 2 - 1.5 = 3.3
    # env 1: 1 + 0.5 * 1 - 2 = -0.5, 1 + 0 - 4 = -3, 1 + 0.5 * 10 - 8 = -2
    close(out.pg_advantages, torch.tensor([[6.188, -0.5], [5.32, -3.0], [3.3, -2.0]]))
    close(out.rhos, torch.ones(3, 2))


# One off-policy unroll: ratios pi/mu = 0.5/0.25, 0.25/0.5, 0.6/0.4 = 2, 0.5, 1.5; rewards
# 1, 0, 2; V = 1, 2, 3; V(x_T) = 4. Plain TD errors r + 0.9 V' - V: 1.8, 0.7, 2.6.
BEHAVIOUR = torch.log(column(0.25, 0.5, 0.4))
TARGET = torch.log(column(0.5, 0.25, 0.6))
REWARDS = column(1.0, 0.0, 2.0)
DISCOUNTS = column(0.9, 0.9, 0.9)
VALUES = column(1.0, 2.0, 3.0)
BOOTSTRAP = torch.tensor([4.0])


@pytest.mark.parametrize(
    "clip_rho, clip_c, clip_pg_rho, vs, pg",
    [
        # rho = c = (1, 0.5, 1): deltas 1.8, 0.35, 2.6;
        # v2 - V2 = 2.6, v1 - V1 = 0.35 + 0.9 * 0.5 * 2.6 = 1.52, v0 - V0 = 1.8 + 0.9 * 1.52 = 3.168
        # pg: 1 * (1 + 0.9 * 3.52 - 1), 0.5 * (0 + 0.9 * 5.6 - 2), 1 * (2 + 0.9 * 4 - 3)
        (1.0, 1.0, 1.0, [4.168, 3.52, 5.6], [3.168, 1.52, 2.6]),
        # rho unclipped (2, 0.5, 1.5), c = (1, 0.5, 1): deltas 3.6, 0.35, 3.9;
        # 3.9, 0.35 + 0.45 * 3.9 = 2.105, 3.6 + 0.9 * 2.105 = 5.4945
        # pg: 1 * (1 + 0.9 * 4.105 - 1), 0.5 * (0.9 * 6.9 - 2), 1 * 2.6
        (10.0, 1.0, 1.0, [6.4945, 4.105, 6.9], [3.6945, 2.105, 2.6]),
        # rho = (1, 0.5, 1), c = (2, 0.5, 1.5): c_2 multiplies nothing;
        # 2.6, 1.52, 1.8 + 0.9 * 2 * 1.52 = 4.536
        # pg with rho (2, 0.5, 1.5): 2 * 3.168, 0.5 * 3.04, 1.5 * 2.6
        (1.0, 2.0, 2.0, [5.536, 3.52, 5.6], [6.336, 1.52, 3.9]),
    ],
)
def test_off_policy_clipping(clip_rho, clip_c, clip_pg_rho, vs, pg):
    out = vtrace(
        BEHAVIOUR, TARGET, REWARDS, DISCOUNTS, VALUES, BOOTSTRAP, clip_rho, clip_c, clip_pg_rho
    )
    close(out.vs, column(*vs))
    close(out.pg_advantages, column(*pg))
    close(out.rhos, column(2.0, 0.5, 1.5))


def test_lambda_shortens_the_traces():
    # lam 0.5: c = 0.5 * (1, 0.5, 1); deltas 1.8, 0.35, 2.6 (rho = (1, 0.5, 1));
    # v2 - V2 = 2.6, v1 - V1 = 0.35 + 0.9 * 0.25 * 2.6 = 0.935,
    # v0 - V0 = 1.8 + 0.9 * 0.5 * 0.935 = 2.22075
    # pg: 1 * (1 + 0.9 * 2.935 - 1), 0.5 * (0.9 * 5.6 - 2), 1 * (2 + 0.9 * 4 - 3)
    out = vtrace(BEHAVIOUR, TARGET, REWARDS, DISCOUNTS, VALUES, BOOTSTRAP, lam=0.5)
    close(out.vs, column(3.22075, 2.935, 5.6))
    close(out.pg_advantages, column(2.6415, 1.52, 2.6))


def test_on_policy_lambda_targets_are_gae():
    """On-policy (rho = c = 1), v_s - V(x_s) with lambda is GAE(lambda)'s advantage."""
    from apexrl.algorithms.ppo.losses import gae

    g = torch.Generator().manual_seed(0)
    rewards, values = torch.randn(6, 3, generator=g), torch.randn(6, 3, generator=g)
    discounts = torch.full((6, 3), 0.9)
    discounts[2, 1] = 0.0
    bootstrap, log_probs = torch.randn(3, generator=g), torch.randn(6, 3, generator=g)
    out = vtrace(log_probs, log_probs, rewards, discounts, values, bootstrap, lam=0.8)
    advantages, returns = gae(rewards, discounts, values, bootstrap, 0.8)
    close(out.vs - values, advantages)
    close(out.vs, returns)


def test_termination_hides_what_follows():
    log_probs = torch.zeros(3, 1)
    discounts = column(0.9, 0.0, 0.9)  # terminated at step 1
    out = vtrace(
        log_probs, log_probs, column(1.0, 2.0, 3.0), discounts, column(0.5, 1.0, 1.5), BOOTSTRAP
    )
    # v1 = 2 (no bootstrap), v0 = 1 + 0.9 * 2 = 2.8; pg 1 + 0.9 * 2 - 0.5 = 2.3, 2 - 1 = 1
    close(out.vs[:2], column(2.8, 2.0))
    close(out.pg_advantages[:2], column(2.3, 1.0))
    # The next episode's rewards, values and bootstrap do not reach steps 0 and 1.
    other = vtrace(
        log_probs, log_probs, column(1.0, 2.0, -7.0), discounts, column(0.5, 1.0, 9.0), -BOOTSTRAP
    )
    close(other.vs[:2], out.vs[:2])
    close(other.pg_advantages[:2], out.pg_advantages[:2])


def test_truncated_end_is_a_bootstrapped_reward_with_discount_zero():
    # The episode hits its time limit at step 1 with V_behaviour(final observation) = 5; a new
    # episode starts at step 2. The actor writes reward 2 + 0.9 * 5 = 6.5 and discount 0 there.
    behaviour = torch.log(column(0.25, 0.5, 0.5))
    target = torch.log(column(0.5, 0.25, 0.5))  # ratios 2, 0.5, 1: rho = c = 1, 0.5, 1
    values = column(0.5, 1.0, 1.5)
    truncated = vtrace(
        behaviour, target, column(1.0, 6.5, 3.0), column(0.9, 0.0, 0.9), values, BOOTSTRAP
    )
    # v1 - V1 = 0.5 * (6.5 - 1) = 2.75; v0 - V0 = 1 * (1 + 0.9 * 1 - 0.5) + 0.9 * 2.75 = 3.875
    # pg: 1 * (1 + 0.9 * 3.75 - 0.5) = 3.875, 0.5 * (6.5 - 1) = 2.75
    close(truncated.vs[:2], column(4.375, 3.75))
    close(truncated.pg_advantages[:2], column(3.875, 2.75))
    # The same as an unroll that continued after step 1 into an observation worth 5.
    continuing = vtrace(
        behaviour[:2],
        target[:2],
        column(1.0, 2.0),
        column(0.9, 0.9),
        values[:2],
        torch.tensor([5.0]),
    )
    close(truncated.vs[:2], continuing.vs)
    close(truncated.pg_advantages[:2], continuing.pg_advantages)


def test_targets_carry_no_gradient():
    values = VALUES.clone().requires_grad_()
    target = TARGET.clone().requires_grad_()
    out = vtrace(BEHAVIOUR, target, REWARDS, DISCOUNTS, values, BOOTSTRAP)
    assert not out.vs.requires_grad and not out.pg_advantages.requires_grad


def test_impala_loss_by_hand():
    # T=2, B=1, two actions: pi = (0.5, 0.5) then (0.75, 0.25); actions 0 then 1.
    logits = torch.tensor([[[0.0, 0.0]], [[math.log(3.0), 0.0]]], requires_grad=True)
    actions = torch.tensor([[0], [1]])
    values = column(1.5, 1.0).requires_grad_()
    targets = VTrace(vs=column(2.0, 1.0), pg_advantages=column(1.0, -2.0), rhos=torch.ones(2, 1))
    loss, figures = impala_loss(logits, actions, values, targets)

    # policy: -(log 0.5 * 1 + log 0.25 * -2) / 2 = -(3 log 2) / 2
    policy_loss = -1.5 * math.log(2.0)
    # baseline: 0.5 * ((2 - 1.5)^2 + 0^2) / 2 = 0.0625
    # entropy: (log 2 + 0.75 * log(4/3) + 0.25 * log 4) / 2
    entropy = (math.log(2.0) + 0.75 * math.log(4 / 3) + 0.25 * math.log(4.0)) / 2
    close(figures["policy_loss"], torch.tensor(policy_loss))
    close(figures["baseline_loss"], torch.tensor(0.0625))
    close(figures["entropy"], torch.tensor(entropy))
    close(loss, torch.tensor(policy_loss + 0.5 * 0.0625 - 0.01 * entropy))
    close(figures["rho_mean"], torch.tensor(1.0))

    loss.backward()
    # d/dV: baseline_cost * (V - v) / 2 = 0.5 * (-0.5) / 2, and 0.
    close(values.grad, column(-0.125, 0.0))
    # d/dlogits of the policy term: -(onehot(a) - pi) * A / 2, then the entropy bonus's part:
    # dH/dlogit_i = -pi_i (log pi_i + H); zero at the uniform step 0.
    h1 = 0.75 * math.log(4 / 3) + 0.25 * math.log(4.0)
    d_entropy_1 = [-0.75 * (math.log(0.75) + h1), -0.25 * (math.log(0.25) + h1)]
    want = torch.tensor(
        [
            [[-0.25, 0.25]],
            [[-0.75 - 0.01 * d_entropy_1[0] / 2, 0.75 - 0.01 * d_entropy_1[1] / 2]],
        ]
    )
    close(logits.grad, want)


@pytest.mark.parametrize("passes", [1, 3])
def test_impala_takes_passes_gradient_steps_on_each_batch(passes):
    """passes = n: n Adam steps on one batch."""
    from apexrl.config import LearnerConfig

    config = LearnerConfig(
        algorithm="impala", env="CartPole-v1", batch_size=4, algo=Settings(passes=passes)
    )
    learning, batch = unroll_learning(config, 4)
    learning.update(batch, torch.ones(4), 1)
    steps = {int(state["step"]) for state in learning.optimizer.state.values()}
    assert steps == {passes}


def test_impala_refuses_passes_below_one():
    from apexrl import algorithms
    from apexrl.config import LearnerConfig

    config = LearnerConfig(algorithm="impala", env="CartPole-v1", algo=Settings(passes=0))
    with pytest.raises(ValueError, match="^passes"):
        algorithms.make(config)


@pytest.mark.parametrize("optimizer", ["adam", "rmsprop"])
def test_the_first_step_is_the_named_optimizers(optimizer):
    """From a fresh state, Adam moves each weight by lr * g / (|g| + eps), RMSProp (decay 0.99)
    by lr * g / (sqrt(0.01 g^2) + eps): g the clipped gradient the step leaves behind."""
    from apexrl.config import LearnerConfig

    settings = Settings(optimizer=optimizer, optimizer_eps=0.1)
    config = LearnerConfig(algorithm="impala", env="CartPole-v1", batch_size=4, algo=settings)
    learning, batch = unroll_learning(config, 4)
    before = [p.detach().clone() for p in learning.net.parameters()]
    learning.update(batch, torch.ones(4), 1)
    lr = config.learning_rate
    for old, p in zip(before, learning.net.parameters(), strict=True):
        g = p.grad
        scale = g.abs() if optimizer == "adam" else (0.01 * g**2).sqrt()
        close(p.detach(), old - lr * g / (scale + 0.1))


@pytest.mark.parametrize(
    "settings, error",
    [({"optimizer": "sgd"}, "^optimizer: must be one of adam, rmsprop, got 'sgd'"),
     ({"optimizer_eps": 0.0}, "^optimizer_eps: must be > 0, got 0.0")],
)  # fmt: skip
def test_impala_refuses_an_unknown_optimizer_and_a_bad_eps(settings, error):
    from apexrl import algorithms
    from apexrl.config import LearnerConfig

    config = LearnerConfig(algorithm="impala", env="CartPole-v1", algo=Settings(**settings))
    with pytest.raises(ValueError, match=error):
        algorithms.make(config)


def test_clipped_impala_loss_has_the_plain_gradient_at_the_start_and_none_past_the_clip():
    """clip_range with start_log_probs: at ratio 1 the gradient is the plain policy term's; a
    ratio past 1 + eps with a positive advantage gives that step no policy gradient, one inside
    the clip the gradient of -r A."""
    logits = torch.tensor([[[0.0, math.log(3.0)]], [[math.log(3.0), 0.0]]])  # [T=2, B=1, A=2]
    actions = torch.tensor([[1], [0]])  # pi(a) = 0.75 at both steps
    values = torch.zeros(2, 1)
    targets = VTrace(torch.zeros(2, 1), torch.tensor([[1.0], [-2.0]]), torch.ones(2, 1))
    log_pi = torch.log_softmax(logits, -1).gather(-1, actions.unsqueeze(-1)).squeeze(-1)

    def grad(start, clip):
        leaf = logits.clone().requires_grad_(True)
        impala_loss(leaf, actions, values, targets, 0.0, 0.0, start, clip)[0].backward()
        return leaf.grad

    close(grad(log_pi, 0.2), grad(None, None))
    # The policy has moved since the start: r = 0.75 / 0.5 = 1.5 at step 0 (A = 1 > 0: past
    # 1.2, clipped, no gradient), r = 0.75 / 0.9 at step 1 (A = -2: inside [0.8, 1.2]).
    moved = grad(torch.log(torch.tensor([[0.5], [0.9]])), 0.2)
    assert torch.all(moved[0] == 0)
    # d/dlogits of -r A / T = r (onehot(a) - pi) at step 1 (A = -2, T = 2)
    r = 0.75 / 0.9
    close(moved[1], torch.tensor([[r * (1 - 0.75), r * (0 - 0.25)]]))


def test_impala_loss_normalizes_the_advantages_when_asked():
    logits = torch.tensor([[[0.0, 1.0]], [[0.5, 0.0]], [[0.0, -1.0]]])
    actions, values = torch.tensor([[1], [0], [0]]), torch.zeros(3, 1)
    advantages = column(1.0, 2.0, 6.0)  # mean 3, std (sample) sqrt(7)
    scaled = (advantages - 3.0) / 7.0**0.5

    def grad(pg, normalize):
        leaf = logits.clone().requires_grad_(True)
        targets = VTrace(torch.zeros(3, 1), pg, torch.ones(3, 1))
        impala_loss(leaf, actions, values, targets, 0.0, 0.0, normalize=normalize)[0].backward()
        return leaf.grad

    close(grad(advantages, True), grad(scaled, False))
    assert not torch.allclose(grad(advantages, False), grad(scaled, False))


@pytest.mark.parametrize("passes", [1, 3])
def test_impala_passes_share_one_vtrace_and_clip_against_the_first_policy(monkeypatch, passes):
    """V-trace runs once per batch, with the config's lambda; every pass's loss gets those
    targets and, with passes > 1, the log-probabilities of the policy before the first step and
    the clip; one pass is the published loss (no start, no ratio)."""
    from apexrl.algorithms.impala import learning as impala
    from apexrl.config import LearnerConfig

    traces, losses = [], []

    def recording_vtrace(*args, **kwargs):
        traces.append((args[1].detach().clone(), kwargs))
        return vtrace(*args, **kwargs)

    def recording_loss(logits, actions, values, targets, *args, **kwargs):
        log_pi = torch.log_softmax(logits, -1).gather(-1, actions.unsqueeze(-1)).squeeze(-1)
        losses.append((log_pi.detach().clone(), targets, *args))
        return impala_loss(logits, actions, values, targets, *args, **kwargs)

    monkeypatch.setattr(impala, "vtrace", recording_vtrace)
    monkeypatch.setattr(impala, "impala_loss", recording_loss)
    settings = Settings(passes=passes, clip_range=0.3, gae_lambda=0.7)
    config = LearnerConfig(
        algorithm="impala", env="CartPole-v1", batch_size=4, learning_rate=0.05, algo=settings
    )
    learning, batch = unroll_learning(config, 4)
    learning.update(batch, torch.ones(4), 1)

    assert len(traces) == 1 and traces[0][1] == {"lam": 0.7}
    assert len(losses) == passes
    first = traces[0][0]
    for _, targets, value_cost, entropy_cost, start, clip, normalize in losses:
        assert targets is losses[0][1]
        assert (value_cost, entropy_cost, normalize) == (0.5, 0.01, False)
        if passes == 1:
            assert start is None
        else:
            close(start, first)
            assert clip == 0.3 and not start.requires_grad
    close(losses[0][0], first)
    if passes > 1:
        assert not torch.allclose(losses[-1][0], first)  # the later passes' policy has moved
