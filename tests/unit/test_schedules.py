"""Schedules: a setting's values over the learner's updates (schedules.py), read from a config
file, flags and the environment, applied before every update (learner/scheduled.py),
continued after a resume, refused with the setting's name when they cannot be."""

import math
from types import SimpleNamespace

import numpy as np
import prometheus_client
import pytest
import torch

from apexrl import algorithms
from apexrl import config as cfg
from apexrl.common.parameters import ParameterStore
from apexrl.learner.metrics import LearnerMetrics
from apexrl.learner.scheduled import ScheduledSettings
from apexrl.learner.training import Learner
from apexrl.local.settings import dump_toml
from apexrl.replay.server import make_table
from apexrl.schedules import Schedule, parse


def test_linear_values_by_hand():
    s = parse({"linear": [0.4, 1.0], "over": "1K updates"}, "beta")
    assert [s.value(t) for t in (0, 250, 500, 1000, 5000)] == pytest.approx(
        [0.4, 0.55, 0.7, 1.0, 1.0]
    )
    assert float(s) == 0.4  # read once (an optimizer made, a check): the start


def test_exponential_values_by_hand():
    s = parse('{ exponential = [0.2, 0.002], over = "100 updates" }', "clip_range")
    assert [s.value(t) for t in (0, 50, 100, 200)] == pytest.approx([0.2, 0.02, 0.002, 0.002])


def test_piecewise_values_by_hand():
    s = parse({"piecewise": [[100, 1.0], [200, 0.1], [1100, 0.01]], "unit": "updates"}, "x")
    assert [s.value(t) for t in (0, 100, 150, 200, 650, 1100, 10**6)] == pytest.approx(
        [1.0, 1.0, 0.55, 0.1, 0.055, 0.01, 0.01]
    )


@pytest.mark.parametrize(
    "text",
    [
        '{ linear = [3e-4, 0.0], over = "1M updates" }',
        '{ exponential = [1.0, 0.5], over = "2.5K updates" }',
        '{ piecewise = [[0, 1.0], [10, 0.5]], unit = "updates" }',
    ],
)
def test_a_schedule_reads_back_what_it_writes(text):
    s = parse(text, "x")
    again = parse(s.toml(), "x")
    assert again.points == s.points and again.shape == s.shape
    assert parse(s.table(), "x").points == s.points


@pytest.mark.parametrize(
    "value, says",
    [
        ({"cosine": [1.0, 0.0], "over": "5 updates"}, "a schedule is one of linear"),
        ({"linear": [1.0, 0.0], "over": "-5 updates"}, "length must be > 0"),
        ({"linear": [1.0, 0.0], "over": "0 updates"}, "length must be > 0"),
        ({"linear": [1.0, 0.0], "over": "5 fortnights"}, "its schedule counts updates"),
        ({"linear": [1.0], "over": "5 updates"}, r"linear takes \[start, end\]"),
        ({"exponential": [1.0, 0.0], "over": "5 updates"}, "values > 0"),
        ({"piecewise": [[5, 1.0], [5, 0.0]], "unit": "updates"}, "increasing"),
        ("{ linear = [1.0, 0.0] ", "not a number nor a schedule"),
    ],
)
def test_a_bad_schedule_is_refused_naming_the_setting(value, says):
    with pytest.raises(ValueError, match=f"^learning_rate: .*{says}"):
        parse(value, "learning_rate")


def learner_config(tmp_path, *flags: str, algorithm: str = "ppo") -> cfg.LearnerConfig:
    path = tmp_path / "apexrl.toml"
    path.write_text(
        f'algorithm = "{algorithm}"\n[learner]\n'
        'learning_rate = { linear = [1e-3, 0.0], over = "1K updates" }\n'
    )
    argv = ["--config", str(path), "--checkpoint-dir", str(tmp_path / "ckpt"), *flags]
    return cfg.parse(cfg.LearnerConfig, argv, "learner", "apexrl learner", algorithms.REGISTRY)


def test_file_flags_and_environment_give_schedules(tmp_path, monkeypatch):
    monkeypatch.setenv("APEXRL_ENTROPY_COST", '{ linear = [0.01, 0.0], over = "10 updates" }')
    config = learner_config(
        tmp_path, "--clip-range", '{ exponential = [0.2, 0.02], over = "100 updates" }'
    )
    assert isinstance(config.learning_rate, Schedule) and config.learning_rate.value(500) == 5e-4
    assert config.algo.clip_range.value(100) == pytest.approx(0.02)
    assert config.algo.entropy_cost.value(5) == pytest.approx(0.005)
    # local mode writes them into its run folder's config as it read them
    text = dump_toml({"learner": {"learning_rate": config.learning_rate}})
    assert "linear = [\n    0.001,\n    0.0,\n]" in text and 'over = "1000 updates"' in text


@pytest.mark.parametrize(
    "text, says",
    [
        ('[learner]\nbatch_size = { linear = [32, 64], over = "5 updates" }\n', "batch_size"),
        ('[ppo]\nepochs = { linear = [4, 1], over = "5 updates" }\n', "epochs"),
    ],
)
def test_a_schedule_on_a_setting_that_cannot_change_is_refused(tmp_path, text, says):
    path = tmp_path / "apexrl.toml"
    path.write_text('algorithm = "ppo"\n' + text)
    with pytest.raises((ValueError, SystemExit)) as raised:
        cfg.parse(cfg.LearnerConfig, ["--config", str(path)], "learner", "x", algorithms.REGISTRY)
    if raised.type is ValueError:
        assert f"{says}: cannot change during a run" in str(raised.value)


def test_a_schedule_whose_end_the_algorithm_refuses_is_refused_at_start(tmp_path):
    with pytest.raises(ValueError, match="clip_range"):
        algorithms.make(
            learner_config(tmp_path, "--clip-range", '{ linear = [0.2, -0.1], over = "5 updates" }')
        )


def test_learning_rates_follow_the_schedule_in_proportion():
    """Two optimizers (dpg's critic and policy at 1e-3 and 1e-4): both follow the learning
    rate's schedule, keeping their ratio; the other settings take the value at the step."""
    critic = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    policy = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], lr=1e-4)
    config = cfg.LearnerConfig(
        learning_rate=parse({"linear": [1e-3, 0.0], "over": "100 updates"}, "x")
    )
    settings = algorithms.get("ppo").Settings(
        clip_range=parse({"linear": [0.2, 0.1], "over": "50 updates"}, "clip_range")
    )
    registry = prometheus_client.CollectorRegistry()
    gauge = prometheus_client.Gauge("g", "g", ["setting"], registry=registry)
    builder = SimpleNamespace(settings=settings, check=lambda: None)
    scheduled = ScheduledSettings(config, builder, [critic, policy], gauge)
    scheduled.apply(25)
    assert critic.param_groups[0]["lr"] == pytest.approx(7.5e-4)
    assert policy.param_groups[0]["lr"] == pytest.approx(7.5e-5)
    assert settings.clip_range == pytest.approx(0.15) and not isinstance(
        settings.clip_range, Schedule
    )
    assert registry.get_sample_value("g", {"setting": "clip_range"}) == pytest.approx(0.15)
    scheduled.apply(1000)
    assert critic.param_groups[0]["lr"] == 0.0 and settings.clip_range == pytest.approx(0.1)


def test_a_scheduled_beta_gives_the_weights_of_that_beta():
    """Sampled with beta 1, raised to the scheduled beta: the weights a table gives for that
    beta itself, (min_batch P / P(i))^beta, on priorities of several sizes."""
    table = make_table(cfg.ReplayTableConfig(name="t", capacity=8, min_size_to_sample=1), 64, 1)
    table.insert({"x": np.arange(6, dtype=np.float32)[:, None]}, np.array([0.1, 0.5, 1, 2, 4, 9]))
    config = cfg.LearnerConfig(beta=parse({"linear": [0.4, 1.0], "over": "100 updates"}, "beta"))
    registry = prometheus_client.CollectorRegistry()
    gauge = prometheus_client.Gauge("g", "g", ["setting"], registry=registry)
    scheduled = ScheduledSettings(config, None, [], gauge)
    assert scheduled.sampling_beta == 1.0
    batch = table.sample(8, beta=1.0)
    for step, beta in ((0, 0.4), (50, 0.7), (100, 1.0)):
        got = scheduled.weights(torch.as_tensor(batch.weights), step).numpy()
        want = (batch.probabilities.min() / batch.probabilities) ** beta
        assert got == pytest.approx(want, rel=1e-5), beta
        assert got.min() < 0.9  # uneven: a wrong power would show


def test_a_resumed_learner_continues_its_schedules(tmp_path):
    """A learner checkpointed after 300 updates resumes at 300: its optimizer's rate is the
    schedule's there (7e-4), not its start."""
    config = learner_config(tmp_path)
    registry = prometheus_client.CollectorRegistry()
    learner = Learner(config, algorithms.make(config), LearnerMetrics(registry), ParameterStore())
    (group,) = learner.learning.optimizers()[0].param_groups
    assert group["lr"] == pytest.approx(1e-3)
    learner.update_step = 300
    learner.scheduled.apply(300)
    learner.checkpoint()
    again = learner_config(tmp_path)
    registry = prometheus_client.CollectorRegistry()
    resumed = Learner(again, algorithms.make(again), LearnerMetrics(registry), ParameterStore())
    assert resumed.update_step == 300
    (group,) = resumed.learning.optimizers()[0].param_groups
    assert group["lr"] == pytest.approx(7e-4)
    value = registry.get_sample_value(
        "apexrl_learner_scheduled_setting", {"setting": "learning_rate"}
    )
    assert math.isclose(value, 7e-4)
    resumed.scheduled.apply(500)  # the schedule still moves the optimizer it loaded
    assert resumed.learning.optimizers()[0].param_groups[0]["lr"] == pytest.approx(5e-4)


def test_each_setting_counts_its_own_steps(tmp_path):
    """The learner's settings count updates, an actor's its env steps: the other unit is
    refused, naming the setting."""
    with pytest.raises(ValueError, match="^learning_rate: its schedule counts updates, got 'env"):
        parse_learner(tmp_path, '{ linear = [1e-3, 0.0], over = "1K env steps" }')
    path = tmp_path / "actor.toml"
    path.write_text('[actor]\nexploration = { linear = [1.0, 0.01], over = "100K env steps" }\n')
    actor = cfg.parse(cfg.ActorConfig, ["--config", str(path)], "actor", "x", algorithms.REGISTRY)
    assert actor.exploration.value(50_000) == pytest.approx(0.505)
    path.write_text('[actor]\nexploration = { linear = [1.0, 0.01], over = "100K updates" }\n')
    with pytest.raises(ValueError, match=r"actor\.toml: exploration: its schedule counts env st"):
        cfg.parse(cfg.ActorConfig, ["--config", str(path)], "actor", "x", algorithms.REGISTRY)


def parse_learner(tmp_path, schedule: str) -> cfg.LearnerConfig:
    flags = ["--learning-rate", schedule]
    return cfg.parse(cfg.LearnerConfig, flags, "learner", "x", algorithms.REGISTRY)


def test_an_actor_explores_by_its_setting_else_by_its_ladder_place():
    from apexrl.actor.loop import exploration

    decay = parse({"linear": [1.0, 0.1], "over": "1K env steps"}, "exploration", "env steps")
    assert exploration(math.nan, 0.4, 500) == 0.4  # the lease's ladder place
    assert exploration(0.05, 0.4, 500) == 0.05
    assert [exploration(decay, 0.4, t) for t in (0, 500, 5000)] == pytest.approx([1.0, 0.55, 0.1])
