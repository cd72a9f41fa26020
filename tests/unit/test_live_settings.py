"""Live changes of a learner's settings (learner/scheduled.py, the SetSetting RPC): on a real
learner in process, a change reaches its optimizer or its algorithm's settings at the next
update, travels in its checkpoints, and a refused one changes nothing."""

import math

import numpy as np
import prometheus_client
import pytest
import torch

from apexrl import algorithms
from apexrl import config as cfg
from apexrl.common.errors import InvalidArgument
from apexrl.common.parameters import ParameterStore
from apexrl.learner.metrics import LearnerMetrics
from apexrl.learner.scheduled import ScheduledSettings
from apexrl.learner.training import Learner
from apexrl.live import changes
from apexrl.replay.server import make_table

GAUGE = "apexrl_learner_scheduled_setting"


def learner(tmp_path, *flags: str, algorithm: str = "ppo") -> tuple[Learner, object]:
    argv = ["--algorithm", algorithm, "--checkpoint-dir", str(tmp_path / "ckpt"), *flags]
    config = cfg.parse(cfg.LearnerConfig, argv, "learner", "x", algorithms.REGISTRY)
    registry = prometheus_client.CollectorRegistry()
    made = Learner(config, algorithms.make(config), LearnerMetrics(registry), ParameterStore())
    return made, registry


def rates(made: Learner) -> list[float]:
    return [g["lr"] for o in made.learning.optimizers() for g in o.param_groups]


def test_a_learning_rate_change_reaches_the_optimizer_at_the_next_update(tmp_path):
    made, registry = learner(tmp_path, "--learning-rate", "1e-3")
    assert rates(made) == [pytest.approx(1e-3)]
    assert made.scheduled.change("learning_rate", 2.5e-4) == pytest.approx(1e-3)
    assert rates(made) == [pytest.approx(1e-3)]  # not before the next update
    made.scheduled.apply(made.update_step + 1)
    assert rates(made) == [pytest.approx(2.5e-4)]
    assert registry.get_sample_value(GAUGE, {"setting": "learning_rate"}) == 2.5e-4


def test_a_change_replaces_a_schedule_and_keeps_a_second_rate_in_proportion(tmp_path):
    """dpg's policy rate (policy_learning_rate 1e-4 beside 1e-3) keeps its ratio to the first;
    the schedule the first one had is over once a change is made."""
    made, _ = learner(
        tmp_path, "--env", "Pendulum-v1", "--learning-rate",
        '{ linear = [1e-3, 0.0], over = "100 updates" }', "--policy-learning-rate", "1e-4",
        algorithm="dpg",
    )  # fmt: skip
    before = rates(made)
    made.scheduled.apply(50)
    assert rates(made) == pytest.approx([r / 2 for r in before])
    made.scheduled.change("learning_rate", 2e-3)
    for step in (51, 100, 1000):
        made.scheduled.apply(step)
        assert rates(made) == pytest.approx([r * 2 for r in before])


def test_an_algorithm_setting_changes_through_its_checks(tmp_path):
    made, _ = learner(tmp_path, "--clip-range", "0.2")
    made.scheduled.change("clip_range", 0.1)
    made.scheduled.apply(1)
    assert made.builder.settings.clip_range == 0.1
    with pytest.raises(InvalidArgument, match="^clip_range: must be >= 0"):
        made.scheduled.change("clip_range", -0.5)
    made.scheduled.apply(2)
    assert made.builder.settings.clip_range == 0.1  # the refused value never applied


@pytest.mark.parametrize(
    "name, value, says",
    [
        ("batch_size", 64.0, "^batch_size: cannot change during a run"),
        ("no_such_setting", 1.0, "^no_such_setting: cannot change during a run"),
        ("learning_rate", math.nan, "^learning_rate: must be finite"),
        ("learning_rate", -1e-3, "^learning_rate: must be >= 0"),
        ("beta", 1.5, r"^beta: must be in \[0, 1\]"),
        ("entropy_cost", -0.1, "^entropy_cost: must be >= 0"),
    ],
)
def test_a_refused_change_names_the_setting_and_changes_nothing(tmp_path, name, value, says):
    made, registry = learner(tmp_path, "--learning-rate", "1e-3")
    settings = made.builder.settings
    before = (rates(made), made.config.beta, made.config.batch_size, settings.entropy_cost)
    with pytest.raises(InvalidArgument, match=says):
        made.scheduled.change(name, value)
    made.scheduled.apply(5)
    after = (rates(made), made.config.beta, made.config.batch_size, settings.entropy_cost)
    assert after == before and made.scheduled.live == {}


def test_a_beta_change_gives_the_weights_of_the_new_beta():
    """Sampled at the config's beta 0.4, weights of beta 0.7 are w(0.4)^(0.7/0.4)."""
    table = make_table(cfg.ReplayTableConfig(name="t", capacity=8, min_size_to_sample=1), 64, 1)
    table.insert({"x": np.arange(6, dtype=np.float32)[:, None]}, np.array([0.1, 0.5, 1, 2, 4, 9]))
    config = cfg.LearnerConfig(beta=0.4)
    gauge = prometheus_client.Gauge("g", "g", ["setting"], registry=None)
    scheduled = ScheduledSettings(config, None, [], gauge)
    assert scheduled.sampling_beta == 0.4
    batch = table.sample(8, beta=0.4)
    weights = torch.as_tensor(batch.weights)
    assert scheduled.weights(weights, 0) is weights  # no change, no schedule: as sampled
    scheduled.change("beta", 0.7)
    got = scheduled.weights(weights, 1).numpy()
    want = (batch.probabilities.min() / batch.probabilities) ** 0.7
    assert got == pytest.approx(want, rel=1e-5) and got.min() < 0.9


def test_beta_sampled_at_zero_cannot_change():
    scheduled = ScheduledSettings(
        cfg.LearnerConfig(beta=0.0), None, [], prometheus_client.Gauge("g", "g", ["setting"])
    )
    with pytest.raises(InvalidArgument, match="^beta: the learner samples with beta 0"):
        scheduled.change("beta", 0.5)


def test_a_change_travels_in_the_checkpoint_and_a_resumed_learner_keeps_it(tmp_path):
    made, _ = learner(tmp_path, "--learning-rate", "1e-3")
    made.scheduled.change("learning_rate", 3e-4)
    made.scheduled.change("entropy_cost", 0.05)
    made.update_step = 7
    made.checkpoint()
    resumed, registry = learner(tmp_path, "--learning-rate", "1e-3")
    assert resumed.update_step == 7
    assert rates(resumed) == [pytest.approx(3e-4)]
    assert resumed.builder.settings.entropy_cost == 0.05
    assert registry.get_sample_value(GAUGE, {"setting": "learning_rate"}) == 3e-4
    assert resumed.scheduled.live == {"learning_rate": 3e-4, "entropy_cost": 0.05}


def test_the_command_line_reads_name_value_pairs():
    assert changes(["learning_rate=1e-4", "beta=0.6"]) == [("learning_rate", 1e-4), ("beta", 0.6)]
    for words, says in (
        (["learning_rate=fast"], "^learning_rate=fast: needs NAME=NUMBER"),
        (["=0.1"], "^=0.1: needs a setting's name"),
        ([], "^no NAME=VALUE given"),
    ):
        with pytest.raises(ValueError, match=says):
            changes(words)


def live_file(tmp_path, text: str):
    from apexrl.learner.live_file import LiveFile

    path = tmp_path / "live.toml"
    path.write_text(text)
    made, registry = learner(tmp_path, "--learning-rate", "1e-3")
    failures = prometheus_client.Counter("f", "f", registry=registry)
    return LiveFile(str(path), made.scheduled, failures), path, made, registry


def test_the_live_file_applies_what_changed_and_only_that(tmp_path):
    live, path, made, _ = live_file(tmp_path, "learning_rate = 5e-4\n")
    live.start()
    made.scheduled.apply(1)
    assert rates(made) == [pytest.approx(5e-4)]
    made.scheduled.change("learning_rate", 1e-4)  # apexrl set, after the file
    path.write_text("learning_rate = 5e-4\nentropy_cost = 0.02\n")  # its rate line as it was
    live.check()
    made.scheduled.apply(2)
    assert rates(made) == [pytest.approx(1e-4)] and made.builder.settings.entropy_cost == 0.02
    live.check()  # unchanged file: nothing read
    assert made.scheduled.changes == 3


def test_a_refused_line_fails_the_start_but_later_only_itself(tmp_path):
    live, path, made, registry = live_file(tmp_path, "clip_range = -1.0\n")
    with pytest.raises(ValueError, match=r"^live_file .*live\.toml: clip_range: must be >= 0"):
        live.start()
    assert made.scheduled.live == {}
    path.write_text("batch_size = 64\nentropy_cost = 0.03\n")
    with pytest.raises(InvalidArgument, match="^batch_size: cannot change during a run"):
        live.check()
    assert made.scheduled.live == {"entropy_cost": 0.03}  # the other line applied
    path.write_text('entropy_cost = "high"\n')
    with pytest.raises(ValueError, match=r"live\.toml: entropy_cost: must be a number"):
        live.check()
