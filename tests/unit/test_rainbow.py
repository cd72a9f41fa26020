"""dqn's options and the `rainbow` preset: a learner per option that finds the Q-values of a
small MDP (so a broken loss fails it), the ladder with noise, bad settings refused at start-up,
how a user selects rainbow."""

import dataclasses

import numpy as np
import pytest
import torch

from apexrl import algorithms
from apexrl.algorithms.dqn.builder import RainbowSettings, Settings
from apexrl.algorithms.dqn.networks import set_noise
from apexrl.config import LearnerConfig
from apexrl.local.settings import parse
from apexrl.local.supervision import Run

# A two-step MDP on one-hot states. State 0: action 0 pays 1 and ends, action 1 pays 0 and
# leads (discount 0.9) to state 1, where action 0 pays 2 and action 1 pays 0, both ending.
# Q(0) = [1, 0.9 * 2], Q(1) = [2, 0]: the greedy action at state 0 needs the bootstrap.
STATES = torch.eye(3)
TRANSITIONS = {
    "obs": STATES[[0, 0, 1, 1]],
    "action": torch.tensor([0, 1, 0, 1]),
    "reward": torch.tensor([1.0, 0.0, 2.0, 0.0]),
    "discount": torch.tensor([0.0, 0.9, 0.0, 0.0]),
    "next_obs": STATES[[2, 1, 2, 2]],
}
TRUE_Q = torch.tensor([[1.0, 1.8], [2.0, 0.0]])

# 11 atoms 0.8 apart with no return on an atom: a projection that splits mass wrongly moves
# the means by 0.2 or more.
C51 = {"distributional": True, "atoms": 11, "v_min": -3.3, "v_max": 4.7}
OPTIONS = {"huber": {}, "noisy": {"noisy": True}, "c51": C51, "rainbow": {"noisy": True, **C51}}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def make(algorithm="dqn", env="CartPole-v1", **settings):
    table = algorithms.get(algorithm).Settings
    config = LearnerConfig(
        algorithm=algorithm, env=env, algo=table(**settings), learning_rate=1e-2, hidden="32"
    )
    return algorithms.make(config)


@pytest.mark.parametrize("option", OPTIONS)
def test_the_learner_finds_the_q_values_of_a_small_mdp(option):
    torch.manual_seed(0)
    builder = make(target_update_interval=10, **OPTIONS[option])
    builder.spec = dataclasses.replace(builder.spec, obs_shape=(3,))
    learning = builder.learning(builder.config, torch.device("cpu"))
    for step in range(1, 601):
        priorities, figures = learning.update(TRANSITIONS, torch.ones(4), step)
    assert priorities.shape == (4,) and (priorities >= 0).all()
    assert np.isfinite(figures["loss"])
    with torch.no_grad():
        set_noise(learning.online, 0.0)
        q = learning.online(STATES[:2])
    torch.testing.assert_close(q, TRUE_Q, atol=0.15, rtol=0)


def test_noisy_actors_have_no_epsilon_ladder():
    assert [make().exploration(i, 3) for i in range(3)] == pytest.approx([0.4, 0.4**4.5, 0.4**8])
    assert [make(noisy=True).exploration(i, 3) for i in range(3)] == [0.0] * 3


@pytest.mark.parametrize(
    "settings, name",
    [
        ({"atoms": 1}, "atoms"),
        ({"v_min": 5.0, "v_max": 5.0}, "v_min"),
        ({"v_min": 6.0, "v_max": 5.0}, "v_min"),
        ({"sigma0": 0.0}, "sigma0"),
        ({"sigma0": -0.5}, "sigma0"),
        ({"adam_epsilon": 0.0}, "adam_epsilon"),
        ({"adam_epsilon": -1e-4}, "adam_epsilon"),
    ],
)
@pytest.mark.parametrize("algorithm", ["dqn", "rainbow"])
def test_bad_settings_refused_at_start_up_naming_the_setting(algorithm, settings, name):
    with pytest.raises(ValueError, match=f"^{name}: "):
        make(algorithm, **settings)


@pytest.mark.parametrize("option", ["huber", "c51"])
def test_adam_epsilon_is_the_floor_of_the_learners_step(option):
    """Adam moves each weight by lr * m / (sqrt(v) + eps): about lr on the first update with
    torch's 1e-8, far less with an epsilon as large as the gradients."""

    def largest_change(**settings):
        torch.manual_seed(0)
        builder = make(**OPTIONS[option], **settings)
        builder.spec = dataclasses.replace(builder.spec, obs_shape=(3,))
        learning = builder.learning(builder.config, torch.device("cpu"))
        before = [p.detach().clone() for p in learning.online.parameters()]
        learning.update(TRANSITIONS, torch.ones(4), 1)
        after = learning.online.parameters()
        return max((a - b).abs().max().item() for a, b in zip(after, before, strict=True))

    lr = 1e-2
    assert largest_change() == pytest.approx(lr, rel=0.01)
    assert largest_change(adam_epsilon=10.0) < lr / 10


def test_rainbow_is_an_algorithm_name_with_dqns_settings_and_rainbows_defaults(tmp_path):
    config = parse(["--algorithm", "rainbow"])
    assert isinstance(config.algo, RainbowSettings) and isinstance(config.algo, Settings)
    s = config.algo
    assert (s.noisy, s.distributional, s.atoms, s.n_step, s.priority_exponent) == (
        True, True, 51, 3, 0.5)  # fmt: skip
    assert (s.v_min, s.v_max, s.capacity) == (-100.0, 100.0, 100_000)  # classic control's preset
    assert (s.adam_epsilon, Settings().adam_epsilon) == (1.5e-4, 1e-8)
    atari = algorithms.get("rainbow").presets("ALE/Breakout-v5")["rainbow"]
    assert "v_min" not in atari and atari["target_update_interval"] == 250
    flagged = parse(["--algorithm", "rainbow", "--v-max", "50", "--no-noisy"])
    assert (flagged.algo.v_max, flagged.algo.noisy) == (50.0, False)
    run = Run(config, {}, tmp_path / "run")
    assert "[rainbow]" in run.config_path.read_text()
