"""The Gaussian policy of Box actions (algorithms/gaussian.py) and the ways it acts
(numpy_policies.ClippedGaussian): its log-probabilities, entropy and KL are torch.distributions',
the env only ever gets actions inside the bounds, the learner the unclipped samples; numpy and
torch policies act alike; settings that need the other kind of action space are refused."""

import numpy as np
import pytest
import torch
from torch.distributions import Independent, Normal, kl_divergence

from apexrl import algorithms
from apexrl.algorithms.actor_critic import ActorCriticPolicy
from apexrl.algorithms.gaussian import DiagGaussian, GaussianHead
from apexrl.algorithms.networks import state_to_numpy
from apexrl.algorithms.numpy_policies import ClippedGaussian, MLPActorCriticPolicy
from apexrl.config import ActorConfig


def normal(out: torch.Tensor) -> Independent:
    mean, log_std = out.chunk(2, -1)
    return Independent(Normal(mean, log_std.exp()), 1)


def outputs(seed: int, batch: int = 64, dims: int = 3) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    mean = torch.randn(batch, dims, generator=g)
    log_std = torch.randn(dims, generator=g) * 0.5
    return torch.cat([mean, log_std.expand_as(mean)], -1)


def test_log_prob_and_entropy_are_torch_distributions():
    out = outputs(0)
    actions = torch.randn(64, 3, generator=torch.Generator().manual_seed(1)) * 2
    log_prob, entropy = DiagGaussian.evaluate(out, actions)
    torch.testing.assert_close(log_prob, normal(out).log_prob(actions))
    torch.testing.assert_close(entropy, normal(out).entropy())
    assert log_prob.std() > 0.5  # the samples differ: a real comparison


def test_kl_is_torch_distributions():
    old, new = outputs(2), outputs(3)
    expected = kl_divergence(normal(old), normal(new)).mean()
    torch.testing.assert_close(DiagGaussian.kl(old, new), expected)
    assert expected > 0.1
    assert float(DiagGaussian.kl(old, old)) == pytest.approx(0.0, abs=1e-6)


def test_the_head_starts_near_zero_with_its_log_std_everywhere():
    torch.manual_seed(0)
    head = GaussianHead(8, 2, log_std_init=-0.5)
    out = head(torch.randn(5, 8))
    assert out.shape == (5, 4)
    torch.testing.assert_close(out[:, 2:], torch.full((5, 2), -0.5))
    out.sum().backward()
    assert head.log_std.grad is not None  # learned, not fixed


def test_samples_reach_the_env_clipped_and_the_learner_unclipped():
    """A wide Gaussian (std e) often lands outside [-2, 1]: the env gets the clipped action, the
    adder the sample, with the log-probability of the sample."""
    low, high = np.array([-2.0, -1.0], np.float32), np.array([1.0, 1.0], np.float32)
    head = ClippedGaussian(low, high)
    mean = np.tile(np.array([[0.5, -0.2]], np.float32), (10_000, 1))
    out = np.concatenate([mean, np.ones_like(mean)], 1)
    actions, extras = head.sample(out, np.random.default_rng(0))
    samples = extras["sampled_actions"]
    assert actions.dtype == np.float32 and actions.shape == (10_000, 2)
    assert (actions >= low).all() and (actions <= high).all()
    assert (samples > high).mean() > 0.2 and (samples < low).mean() > 0.1
    np.testing.assert_array_equal(actions, np.clip(samples, low, high))
    expected = normal(torch.from_numpy(out)).log_prob(torch.from_numpy(samples)).numpy()
    np.testing.assert_allclose(extras["log_probs"], expected, rtol=1e-5, atol=1e-5)
    assert samples.std(0) == pytest.approx([np.e, np.e], rel=0.05)
    far = np.concatenate([mean + 5, np.zeros_like(mean)], 1)
    np.testing.assert_array_equal(head.mode(far), np.broadcast_to(high, (10_000, 2)))


def builder(**settings):
    config = ActorConfig(algorithm="ppo", env="Pendulum-v1", hidden="16,8")
    config.algo = algorithms.get("ppo").Settings(**settings)
    return algorithms.make(config)


@pytest.mark.parametrize("normalize", [False, True])
def test_numpy_and_torch_gaussian_policies_act_alike(normalize):
    b = builder(normalize_observations=normalize, normalize_rewards=normalize)
    mine, net = b.policy(), b.network()
    assert isinstance(mine, MLPActorCriticPolicy)
    torch.manual_seed(4)
    with torch.no_grad():
        for parameter in net.parameters():
            parameter.normal_(0.0, 0.5)
        if normalize:
            net.obs_norm.update(torch.randn(100, 3) * 3 + 1)
            net.return_norm.update(torch.randn(100) * 20)
    weights = state_to_numpy(net)
    theirs = ActorCriticPolicy(net, b.action_head())
    mine.load(weights)
    theirs.load(weights)
    obs = np.random.default_rng(5).normal(0, 2, (32, 3)).astype(np.float32)
    for exploration in (0.0, 1.0):
        np.testing.assert_allclose(
            mine.act(obs, exploration, np.random.default_rng(6)),
            theirs.act(obs, exploration, np.random.default_rng(6)),
            rtol=1e-5,
            atol=1e-5,
        )
    (a, extras), (b_, theirs_extras) = (
        p.step(obs, 1.0, np.random.default_rng(7)) for p in (mine, theirs)
    )
    np.testing.assert_allclose(a, b_, rtol=1e-5, atol=1e-5)
    for name in ("log_probs", "sampled_actions"):
        np.testing.assert_allclose(extras[name], theirs_extras[name], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(mine.values(obs), theirs.values(obs), rtol=1e-4, atol=1e-4)
    assert (np.abs(a) <= 2.0).all() and np.abs(extras["sampled_actions"]).max() > 0
    with torch.no_grad():
        out, values = net(torch.from_numpy(obs))
    expected = normal(out).log_prob(torch.from_numpy(extras["sampled_actions"])).numpy()
    np.testing.assert_allclose(extras["log_probs"], expected, rtol=1e-4, atol=1e-4)
    scale = float(net.return_norm.std()) if normalize else 1.0
    np.testing.assert_allclose(mine.values(obs), values.numpy() * scale, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize(
    "algorithm,env,settings,message",
    [
        (
            "ppo",
            "CartPole-v1",
            {"distribution": "gaussian"},
            r"distribution: gaussian needs a Box action space; CartPole-v1 has a Discrete one with 2",
        ),
        (
            "impala",
            "Pendulum-v1",
            {"distribution": "softmax"},
            r"distribution: softmax needs a Discrete action space; Pendulum-v1 has a Box one",
        ),
        ("ppo", "CartPole-v1", {"distribution": "beta"}, r"distribution: must be one of auto, "),
        (
            "impala",
            "CartPole-v1",
            {"log_std_init": -1.0},
            r"log_std_init: sets a Gaussian policy's log-std; CartPole-v1 has a Discrete one",
        ),
        ("ppo", "Pendulum-v1", {"log_std_init": float("nan")}, r"log_std_init: must be finite"),
        (
            "unreal",
            "Pendulum-v1",
            {"pc_lambda": 0.05},
            r"pc_lambda: pixel control learns a Q-value per Discrete action, Pendulum-v1 has Box",
        ),
    ],
)
def test_settings_for_the_other_kind_of_action_space_are_refused(algorithm, env, settings, message):
    config = ActorConfig(algorithm=algorithm, env=env)
    config.algo = algorithms.get(algorithm).Settings(**settings)
    with pytest.raises(ValueError, match=message):
        algorithms.make(config)


def test_local_mode_refuses_a_gaussian_on_a_discrete_space_at_start_up(tmp_path):
    """The user's command: it exits before any service starts, naming the setting."""
    import subprocess
    import sys

    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "apexrl.cli",
            "local",
            "--algorithm",
            "ppo",
            "--env",
            "CartPole-v1",
            "--distribution",
            "gaussian",
            "--run-dir",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert "distribution: gaussian needs a Box action space" in result.stderr + result.stdout
    assert not list((tmp_path / "run").glob("logs/*"))  # no service started


UNREAL = {"pc_lambda": 0.0, "sequence_length": 5, "replay_batch": 3}


@pytest.mark.parametrize(
    "name,extra",
    [("ppo", {}), ("impala", {}), ("unreal", UNREAL), ("ppo", {"sde_sample_freq": 2})],
    ids=["ppo", "impala", "unreal", "ppo-gsde"],
)
def test_each_on_policy_algorithm_learns_from_its_actors_box_items(name, extra):
    """The builder's own adders on Pendulum-v1 (unreal's replayed sequences and reward windows
    too) make the batch; one update moves every part of the policy, the log-std included
    (gSDE's: one per feature and action dimension)."""
    from apexrl.algorithms.base import Step
    from apexrl.algorithms.envs import make_vector_env
    from apexrl.config import LearnerConfig

    settings = algorithms.get(name).Settings(
        unroll_length=5, normalize_observations=True, normalize_rewards=True, **extra
    )
    config = LearnerConfig(algorithm=name, env="Pendulum-v1", hidden="16", algo=settings)
    builder = algorithms.make(config)
    learning, policy = builder.learning(config, torch.device("cpu")), builder.policy()
    policy.load(learning.parameters())
    envs, obs = make_vector_env("Pendulum-v1", 3, 0)
    adders, rng, items = builder.adders(3, policy), np.random.default_rng(0), {}
    for _ in range(5):
        actions, extras = policy.step(obs, 1.0, rng)
        next_obs, rewards, terminated, truncated, _ = envs.step(actions)
        step = Step(
            obs,
            actions,
            extras,
            rewards.astype(np.float32),
            terminated,
            truncated,
            next_obs,
            next_obs,
            1,
        )
        for adder in adders:
            made = adder.add(step)
            if made is not None:
                items[adder.table] = made  # the last of each table's (the reward windows')
        obs = next_obs
    batch = {k: torch.from_numpy(v) for k, v in items.pop("default").items()}
    assert batch["actions"].dtype == torch.float32 and batch["actions"].shape == (3, 5, 1)
    assert "returns" in batch
    for table, made in items.items():
        batch |= {f"{table}/{k}": torch.from_numpy(v) for k, v in made.items()}
    before = learning.parameters()
    _, figures = learning.update(batch, torch.ones(3), 1)
    after = learning.parameters()
    assert np.isfinite(figures["loss"]) and set(builder.metrics.figures) <= set(figures)
    for part in ("gaussian.mean.weight", "gaussian.log_std", "value.weight", "obs_norm.mean"):
        assert not np.array_equal(before[part], after[part]), part
    assert after["gaussian.log_std"].shape == ((16, 1) if extra.get("sde_sample_freq") else (1,))


def test_pendulum_presets_are_the_zoos_and_ppos_actors_wait_for_the_long_batches():
    presets = algorithms.get("ppo").presets("Pendulum-v1")
    assert (
        presets["ppo"] | {"unroll_length": 1024, "epochs": 10, "minibatches": 64} == presets["ppo"]
    )
    assert presets["learner"]["gamma"] == presets["actor"]["gamma"] == 0.9
    assert presets["ppo"]["sde_sample_freq"] == 4  # the zoo's use_sde, sde_sample_freq 4
    # local mode's 2 actors: 4 envs, each unroll one env's, as the zoo's n_envs 4
    assert presets["learner"]["batch_size"] == 2 * presets["actor"]["num_envs"] == 4
    long = builder(unroll_length=1024).parameter_sync
    assert (long.newer_each_item, long.wait_seconds) == (True, 4.0)
    assert builder(unroll_length=32).parameter_sync.wait_seconds == 1.0
