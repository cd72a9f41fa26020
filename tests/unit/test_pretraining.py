"""Behaviour cloning (learner/pretraining.py): a policy trained on demonstrations takes their
actions on their observations, for an actor-critic and for dqn; apexrl pretrain writes a
checkpoint eval plays; a folder of another env, a missing folder or a negative step count is
refused, naming the setting, before anything is trained or written."""

import re

import numpy as np
import prometheus_client
import pytest
import torch

from apexrl import algorithms, play, pretrain
from apexrl import config as cfg
from apexrl.algorithms import demonstrations
from apexrl.algorithms.demonstrations import Episode
from apexrl.algorithms.envs import env_spec
from apexrl.common.parameters import ParameterStore
from apexrl.learner import pretraining
from apexrl.learner.metrics import LearnerMetrics
from apexrl.learner.training import Learner
from apexrl.local import run as local_run

ENV = "CartPole-v1"


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def rule(observations: np.ndarray) -> np.ndarray:
    """The demonstrator: push the cart the way the pole leans (angle and angular velocity)."""
    return (observations[:, 2] + 0.5 * observations[:, 3] > 0).astype(np.int64)


def synthetic(folder, episodes: int = 4, steps: int = 100, env: str = ENV) -> np.ndarray:
    """Episodes of random observations labelled by rule() (the loader checks shapes and
    dtypes, not dynamics), saved as demonstrations; their observations acted on."""
    rng = np.random.default_rng(0)
    spec, made = env_spec(env), []
    for _ in range(episodes):
        obs = rng.normal(0, 0.2, (steps + 1, *spec.obs_shape)).astype(spec.obs_dtype)
        ends = np.zeros(steps, bool)
        ends[-1] = True
        actions = rule(obs[:-1]) if env == ENV else np.zeros(steps, np.int64)
        made.append(Episode(obs, actions, np.ones(steps), ends, np.zeros(steps, bool)))
    demonstrations.save(demonstrations.prepare(str(folder)), spec, made)
    return np.concatenate([e.observations[:-1] for e in made])


@pytest.mark.parametrize("algorithm", ["ppo", "dqn"])
def test_cloning_lowers_the_loss_and_reproduces_the_demonstrated_actions(tmp_path, algorithm):
    """Trained on 400 pairs, the policy's loss falls from its untrained value to a fraction of
    it, and the policy the actors get (the published parameters, played by the builder's own
    policy) takes the demonstrated action on >= 95% of the demonstrated observations."""
    observations = synthetic(tmp_path / "demos")
    config = cfg.LearnerConfig(
        env=ENV,
        algorithm=algorithm,
        seed=3,
        pretrain_demonstrations=str(tmp_path / "demos"),
        pretrain_steps=300,
        pretrain_batch_size=64,
        pretrain_learning_rate=3e-3,
    )
    torch.manual_seed(3)
    builder = algorithms.make(config)
    learning = builder.learning(config, torch.device("cpu"))
    pairs = pretraining.demonstration_pairs(config, builder.spec)
    np.testing.assert_array_equal(pairs[0], observations)
    before = pretraining.measure(learning, *map(torch.as_tensor, pairs))
    after = pretraining.clone(learning, *pairs, config, torch.device("cpu"))
    assert after["loss"] < 0.5 * before["loss"], (before, after)
    policy = builder.policy()
    policy.load(learning.parameters())
    acted = policy.act(observations, 0.0, np.random.default_rng(0))
    agreement = float((acted == rule(observations)).mean())
    assert agreement >= 0.95 and after["accuracy"] == pytest.approx(agreement), after
    if algorithm == "dqn":  # the target starts from the cloned network
        for online, target in zip(
            learning.online.parameters(), learning.target.parameters(), strict=True
        ):
            assert torch.equal(online, target)


def test_the_loss_and_accuracy_are_over_every_pair_across_chunks():
    """measure() goes over the pairs CHUNK at a time; what it reports is the mean -log pi and
    the share of greedy agreements over all of them, as one pass over all gives."""
    config = cfg.LearnerConfig(env=ENV, algorithm="ppo")
    torch.manual_seed(0)
    learning = algorithms.make(config).learning(config, torch.device("cpu"))
    pairs = pretraining.CHUNK + 904
    obs = torch.randn(pairs, 4)
    actions = torch.randint(0, 2, (pairs,))
    with torch.no_grad():
        out, distribution = learning.imitation(obs)
        log_pi = distribution.evaluate(out, actions)[0]
    figures = pretraining.measure(learning, obs, actions)
    assert figures["loss"] == pytest.approx(float(-log_pi.mean()), rel=1e-5)
    assert figures["accuracy"] == pytest.approx(float((out.argmax(1) == actions).float().mean()))


def test_the_learner_clones_before_its_first_version(tmp_path):
    """The first published version is the cloned policy, and the gauges say how it fits."""
    observations = synthetic(tmp_path / "demos")
    config = cfg.LearnerConfig(
        env=ENV, algorithm="ppo", seed=3, pretrain_demonstrations=str(tmp_path / "demos")
    )
    registry = prometheus_client.CollectorRegistry()
    metrics = LearnerMetrics(registry)
    builder = algorithms.make(config)
    learner = Learner(config, builder, metrics, ParameterStore(0))
    assert learner.store.version == 1 and learner.update_step == 0
    policy = builder.policy()
    policy.load(learner.learning.parameters())
    acted = policy.act(observations, 0.0, np.random.default_rng(0))
    assert (acted == rule(observations)).mean() >= 0.95
    assert registry.get_sample_value("apexrl_learner_pretrain_accuracy") >= 0.95


def test_apexrl_pretrain_writes_a_checkpoint_that_eval_plays(tmp_path, capsys):
    synthetic(tmp_path / "demos")
    argv = ["--algorithm", "ppo", "--env", ENV, "--seed", "1", "--pretrain-steps", "200"]
    argv += ["--pretrain-demonstrations", str(tmp_path / "demos")]
    assert pretrain.main([*argv, "--checkpoint-dir", str(tmp_path / "ckpt")]) == 0
    accuracy = float(re.search(r"accuracy ([0-9.]+)", capsys.readouterr().out)[1])
    assert accuracy >= 0.9
    assert play.main(["--checkpoint", str(tmp_path / "ckpt"), "--episodes", "2"]) == 0
    assert "over 2 episodes" in capsys.readouterr().out


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--env", "Acrobot-v1"], r"pretrain_demonstrations: .*index.json: env_id: 'CartPole-v1'"),
        (["--pretrain-demonstrations", "nowhere"], r"pretrain_demonstrations: .*index.json: no"),
        (["--pretrain-steps", "-1"], r"pretrain_steps: must be >= 0, got -1"),
    ],
)
def test_bad_demonstrations_or_settings_are_refused_before_anything_is_written(
    tmp_path, capsys, flags, message
):
    synthetic(tmp_path / "demos")
    argv = ["--algorithm", "ppo", "--checkpoint-dir", str(tmp_path / "ckpt")]
    argv += ["--pretrain-demonstrations", str(tmp_path / "demos"), *flags]
    assert pretrain.main(argv) == 2
    assert re.search(message, capsys.readouterr().err)
    assert not (tmp_path / "ckpt").exists()


def test_an_episode_file_of_another_env_is_named(tmp_path):
    """A file of another env under a CartPole index: the learner refuses it naming the
    setting and the file, before it builds anything."""
    synthetic(tmp_path / "demos")
    synthetic(tmp_path / "other", env="MountainCar-v0")
    (tmp_path / "demos" / "episode-00001.npz").write_bytes(
        (tmp_path / "other" / "episode-00001.npz").read_bytes()
    )
    config = cfg.LearnerConfig(env=ENV, pretrain_demonstrations=str(tmp_path / "demos"))
    metrics = LearnerMetrics(prometheus_client.CollectorRegistry())
    with pytest.raises(ValueError, match=r"pretrain_demonstrations: .*episode-00001.npz: env_id"):
        Learner(config, algorithms.make(config), metrics, ParameterStore(0))


@pytest.mark.parametrize(
    "learner, message",
    [
        (
            'pretrain_demonstrations = "{demos}"',
            r"pretrain_demonstrations: .*env_id: 'CartPole-v1'",
        ),
        ("pretrain_batch_size = 0", r"pretrain_batch_size: must be >= 1, got 0"),
    ],
)
def test_local_mode_refuses_them_before_any_process_starts(tmp_path, capsys, learner, message):
    synthetic(tmp_path / "demos")
    config = tmp_path / "run.toml"
    config.write_text("[learner]\n" + learner.format(demos=tmp_path / "demos") + "\n")
    argv = ["--env", "Acrobot-v1", "--config", str(config), "--run-dir", str(tmp_path / "run")]
    assert local_run.main(argv) == 2
    assert re.search(message, capsys.readouterr().err)
    assert not (tmp_path / "run" / "config.toml").exists()
    assert not list((tmp_path / "run" / "logs").iterdir())


def test_a_gaussian_policy_learns_box_actions(tmp_path):
    """Box actions: the Gaussian's negative log-likelihood; the evaluation policy's actions
    (the mean, clipped) come within 0.1 of the demonstrated ones, whose spread is 0.5."""
    spec, rng, made = env_spec("Pendulum-v1"), np.random.default_rng(0), []
    for _ in range(2):
        obs = rng.normal(0, 1, (201, *spec.obs_shape)).astype(np.float32)
        ends = np.zeros(200, bool)
        ends[-1] = True
        actions = (-0.5 * obs[:-1, 2:3]).astype(np.float32)
        made.append(Episode(obs, actions, np.zeros(200), ends, np.zeros(200, bool)))
    demonstrations.save(demonstrations.prepare(str(tmp_path / "demos")), spec, made)
    config = cfg.LearnerConfig(
        env="Pendulum-v1",
        algorithm="ppo",
        pretrain_demonstrations=str(tmp_path / "demos"),
        pretrain_steps=300,
    )
    builder = algorithms.make(config)
    learning = builder.learning(config, torch.device("cpu"))
    observations, actions = pretraining.demonstration_pairs(config, builder.spec)
    figures = pretraining.clone(learning, observations, actions, config, torch.device("cpu"))
    assert np.isnan(figures["accuracy"])
    policy = builder.policy()
    policy.load(learning.parameters())
    acted = policy.act(observations, 0.0, rng)
    assert np.abs(acted - actions).mean() < 0.1 and actions.std() > 0.4
