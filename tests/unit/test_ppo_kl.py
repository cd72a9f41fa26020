"""PPO's adaptive KL penalty: the KL by hand against torch.distributions, the coefficient's rule,
the penalty in the loss, the learner's early stop and adaptation, its checkpoint, and bad
settings refused by name."""

import copy
import math

import pytest
import torch

from apexrl import algorithms
from apexrl.algorithms.ppo.builder import KL_COEF_RANGE, Settings
from apexrl.algorithms.ppo.losses import adapted_kl_coef, kl_divergence, ppo_loss
from apexrl.config import LearnerConfig
from tests.conftest import unroll_learning


def test_kl_is_torchs_categorical_kl():
    g = torch.Generator().manual_seed(0)
    old, new = torch.randn(6, 3, generator=g), torch.randn(6, 3, generator=g)
    want = torch.distributions.kl_divergence(
        torch.distributions.Categorical(logits=old), torch.distributions.Categorical(logits=new)
    ).mean()
    torch.testing.assert_close(kl_divergence(old, torch.log_softmax(new, -1)), want)
    assert kl_divergence(old, torch.log_softmax(old, -1)).abs() < 1e-6


@pytest.mark.parametrize(
    ("kl", "coef"),
    [(0.02, 1.0), (0.016, 1.0), (0.015, 0.5), (0.01, 0.5), (0.0067, 0.5), (0.006, 0.25)],
)
def test_the_coefficient_doubles_above_one_and_a_half_targets_and_halves_below(kl, coef):
    assert adapted_kl_coef(0.5, kl, 0.01, KL_COEF_RANGE) == pytest.approx(coef)


def test_the_coefficient_stays_within_its_bounds():
    assert adapted_kl_coef(8.0, 1.0, 0.01, KL_COEF_RANGE) == 10.0
    assert adapted_kl_coef(1.5e-4, 0.0, 0.01, KL_COEF_RANGE) == 1e-4


def test_on_either_edge_of_the_band_the_coefficient_stays():
    assert adapted_kl_coef(0.5, 1.5 * 0.01, 0.01, KL_COEF_RANGE) == 0.5
    assert adapted_kl_coef(0.5, 0.01 / 1.5, 0.01, KL_COEF_RANGE) == 0.5


def test_old_logits_alone_report_the_kl_and_leave_the_loss_as_it_was():
    """kl_coef's default is 0: the "kl" figure without the penalty in the loss."""
    g = torch.Generator().manual_seed(2)
    logits, old = torch.randn(8, 3, generator=g), torch.randn(8, 3, generator=g)
    actions = torch.randint(0, 3, (8,), generator=g)
    old_log_probs = torch.log_softmax(old, -1).gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    advantages = torch.randn(8, generator=g)
    args = (logits, actions, old_log_probs, advantages, torch.zeros(8), torch.ones(8))
    plain, _ = ppo_loss(*args)
    reported, figures = ppo_loss(*args, old_logits=old)
    torch.testing.assert_close(reported, plain)
    torch.testing.assert_close(figures["kl"], kl_divergence(old, torch.log_softmax(logits, -1)))
    assert figures["kl"] > 0


def test_the_penalty_adds_its_coefficient_times_the_kl_to_the_loss():
    g = torch.Generator().manual_seed(1)
    logits, old = torch.randn(8, 2, generator=g), torch.randn(8, 2, generator=g)
    actions = torch.randint(0, 2, (8,), generator=g)
    old_log_probs = torch.log_softmax(old, -1).gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    args = (
        logits,
        actions,
        old_log_probs,
        torch.randn(8, generator=g),
        torch.zeros(8),
        torch.ones(8),
    )
    plain, _ = ppo_loss(*args)
    penalized, figures = ppo_loss(*args, old_logits=old, kl_coef=0.7)
    kl = kl_divergence(old, torch.log_softmax(logits, -1))
    torch.testing.assert_close(penalized, plain + 0.7 * kl)
    torch.testing.assert_close(figures["kl"], kl)


def make(size: int = 4, **settings):
    config = LearnerConfig(
        algorithm="ppo", env="CartPole-v1", batch_size=size, algo=Settings(**settings)
    )
    return unroll_learning(config, size)


def steps_taken(learning, monkeypatch) -> list:
    steps = []
    step = learning.step
    monkeypatch.setattr(learning, "step", lambda loss: (steps.append(1), step(loss)))
    return steps


def test_an_update_stops_at_a_minibatch_past_four_targets(monkeypatch):
    """The first minibatch meets the batch's own policy (KL 0): one step; the next one's KL
    is past 4 x 1e-9, so the update ends there, not after 3 x 4 steps."""
    torch.manual_seed(0)
    learning, batch = make(kl_target=1e-9, epochs=3, minibatches=4)
    steps = steps_taken(learning, monkeypatch)
    learning.update(batch, torch.ones(4), 1)
    assert len(steps) == 1
    learning, batch = make(epochs=3, minibatches=4)  # no penalty: every step
    steps = steps_taken(learning, monkeypatch)
    learning.update(batch, torch.ones(4), 1)
    assert len(steps) == 12


def test_the_learner_adapts_its_coefficient_to_the_kl_its_update_made():
    torch.manual_seed(0)
    learning, batch = make(kl_target=0.01, kl_coef=0.5, epochs=4, minibatches=2)
    before = copy.deepcopy(learning.net)
    obs = batch["observations"][:, :-1].reshape(-1, *batch["observations"].shape[2:])
    _, figures = learning.update(batch, torch.ones(4), 1)
    with torch.no_grad():
        kl = float(kl_divergence(before(obs)[0], torch.log_softmax(learning.net(obs)[0], -1)))
    assert kl > 0
    want = adapted_kl_coef(0.5, kl, 0.01, KL_COEF_RANGE)
    assert learning.kl_coef == pytest.approx(want) and figures["kl_coef"] == learning.kl_coef
    arrays, meta = learning.state()
    resumed, _ = make(kl_target=0.01, kl_coef=0.5)
    resumed.load_state(arrays, meta)
    assert resumed.kl_coef == learning.kl_coef


def test_without_a_target_the_coefficient_is_zero():
    learning, batch = make()
    _, figures = learning.update(batch, torch.ones(4), 1)
    assert learning.kl_coef == 0.0 and figures["kl_coef"] == 0.0


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"kl_target": -0.01}, "kl_target: must be >= 0"),
        ({"kl_target": math.nan}, "kl_target: must be >= 0"),
        ({"kl_target": 0.01, "kl_coef": 0.0}, r"kl_coef: must be in \[0.0001, 10.0\]"),
        ({"kl_target": 0.01, "kl_coef": 20.0}, r"kl_coef: must be in \[0.0001, 10.0\]"),
    ],
)
def test_bad_kl_settings_are_refused_by_name(settings, message):
    config = LearnerConfig(algorithm="ppo", env="CartPole-v1", algo=Settings(**settings))
    with pytest.raises(ValueError, match=message):
        algorithms.make(config)
