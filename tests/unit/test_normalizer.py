"""Observation and reward normalization (algorithms/normalizer.py): the running statistics by
hand, what the learner trains on and folds in, the actors' running returns, and the statistics
travelling with the model: published, checkpointed, resumed and played by `apexrl eval`."""

import subprocess
import sys

import numpy as np
import pytest
import torch

from apexrl import algorithms, play
from apexrl.algorithms.adders.unroll import UnrollAdder
from apexrl.algorithms.base import Step, prefixed
from apexrl.algorithms.normalizer import ObservationNormalizer, RunningMeanStd
from apexrl.config import LearnerConfig
from apexrl.learner import checkpoint

PRIOR = 1e-4  # the statistics' first count (mean 0, variance 1), as SB3's


def merged(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and variance of the prior (count 1e-4, mean 0, var 1) and samples x [N, ...]
    together, by the textbook formula (one merge of two groups)."""
    n = len(x)
    mean = x.sum(0) / (n + PRIOR)
    m2 = PRIOR * 1.0 + ((x - x.mean(0)) ** 2).sum(0) + x.mean(0) ** 2 * PRIOR * n / (n + PRIOR)
    return mean, m2 / (n + PRIOR)


def test_running_statistics_by_hand():
    rng = np.random.default_rng(0)
    x = rng.normal([3.0, -20.0], [0.5, 7.0], (300, 2))
    stats = RunningMeanStd((2,))
    for part in np.split(x, [10, 11, 200]):  # uneven batches, one of a single sample
        stats.update(torch.from_numpy(part))
    mean, var = merged(x)
    np.testing.assert_allclose(stats.mean.numpy(), mean, rtol=1e-9)
    np.testing.assert_allclose(stats.var.numpy(), var, rtol=1e-9)
    assert float(stats.count) == pytest.approx(300 + PRIOR)
    assert var[1] == pytest.approx(49.0, rel=0.2)  # the data's, not the prior's


def test_observations_are_standardized_and_clipped_to_ten():
    norm = ObservationNormalizer((2,))
    norm.update(torch.tensor([[1.0, 10.0], [3.0, 10.0]], dtype=torch.float64))
    out = norm(torch.tensor([[2.0, 10.0], [1000.0, -1000.0]]))
    mean, var = merged(np.array([[1.0, 10.0], [3.0, 10.0]]))
    expected = np.clip(
        (np.array([[2.0, 10.0], [1000.0, -1000.0]]) - mean) / np.sqrt(var + 1e-8), -10, 10
    )
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5, atol=1e-5)  # float32
    assert out.dtype == torch.float32 and out[1].abs().max() == 10.0


def test_the_adder_records_each_envs_running_discounted_return():
    adder = UnrollAdder(
        2, 3, (1,), np.float32, gamma=0.5, returns=True, action_shape=(1,), action_dtype=np.float32
    )
    rewards = [[1.0, 2.0], [1.0, 2.0], [4.0, 2.0]]
    ends = [[False, True], [False, False], [False, False]]
    for t in range(3):
        obs = np.full((2, 1), t, np.float32)
        sampled = np.full((2, 1), 5.0 + t, np.float32)  # past the bounds: recorded as sampled
        step = Step(
            obs,
            np.clip(sampled, -2, 2),
            {"log_probs": np.zeros(2, np.float32), "sampled_actions": sampled},
            np.array(rewards[t], np.float32),
            np.array(ends[t]),
            np.zeros(2, bool),
            obs + 1,
            obs + 1,
            1,
        )
        items = adder.add(step)
    # env 0: 1, 0.5 + 1, 0.75 + 4; env 1: 2 (its episode ends: back to 0), 2, 1 + 2
    np.testing.assert_allclose(items["returns"], [[1.0, 1.5, 4.75], [2.0, 2.0, 3.0]])
    np.testing.assert_array_equal(items["actions"][:, :, 0], [[5, 6, 7], [5, 6, 7]])


def ppo_learning(tmp_path=None):
    settings = algorithms.get("ppo").Settings(
        unroll_length=5,
        epochs=1,
        minibatches=1,
        normalize_observations=True,
        normalize_rewards=True,
    )
    config = LearnerConfig(
        algorithm="ppo",
        env="Pendulum-v1",
        hidden="16",
        algo=settings,
        checkpoint_dir=str(tmp_path or ""),
    )
    return config, algorithms.make(config).learning(config, torch.device("cpu"))


def unrolls(seed: int, b: int = 4, t: int = 5) -> dict[str, torch.Tensor]:
    rng = np.random.default_rng(seed)
    f32 = np.float32
    return {
        "observations": torch.from_numpy(
            rng.normal([5, -3, 1], [2, 0.1, 9], (b, t + 1, 3)).astype(f32)
        ),
        "actions": torch.from_numpy(rng.normal(0, 1, (b, t, 1)).astype(f32)),
        "rewards": torch.from_numpy(rng.normal(-30, 10, (b, t)).astype(f32)),
        "discounts": torch.full((b, t), 0.9),
        "log_probs": torch.from_numpy(rng.normal(-1, 0.1, (b, t)).astype(f32)),
        "returns": torch.from_numpy(rng.normal(-200, 50, (b, t)).astype(f32)),
        "version": torch.ones(b, dtype=torch.int64),
    }


def test_the_learner_trains_on_scaled_rewards_then_folds_the_batch_in(monkeypatch):
    _, learning = ppo_learning()
    first, second = unrolls(1), unrolls(2)
    learning.update(first, torch.ones(4), 1)
    std = float(np.sqrt(merged(first["returns"].double().numpy().reshape(-1))[1] + 1e-8))
    seen = []
    learn = learning.learn
    monkeypatch.setattr(learning, "learn", lambda batch, *a: seen.append(batch) or learn(batch, *a))
    learning.update(second, torch.ones(4), 2)
    # scaled by the statistics published with the version that acted (the first batch's)
    expected = np.clip(second["rewards"].numpy() / std, -10, 10)
    np.testing.assert_allclose(seen[0]["rewards"].numpy(), expected, rtol=1e-5)
    torch.testing.assert_close(
        seen[0]["observations"], second["observations"]
    )  # raw: the net normalizes
    both = torch.cat([first["returns"], second["returns"]]).double().numpy().reshape(-1)
    np.testing.assert_allclose(learning.net.return_norm.var.numpy(), merged(both)[1], rtol=1e-6)
    obs = torch.cat([first["observations"][:, :-1], second["observations"][:, :-1]])
    mean, var = merged(obs.double().numpy().reshape(-1, 3))  # not the bootstrap observations
    np.testing.assert_allclose(learning.net.obs_norm.mean.numpy(), mean, rtol=1e-6)
    np.testing.assert_allclose(learning.net.obs_norm.var.numpy(), var, rtol=1e-6)


def test_the_statistics_travel_with_the_model_into_apexrl_eval(tmp_path):
    config, learning = ppo_learning(tmp_path)
    for seed in (1, 2, 3):
        learning.update(unrolls(seed), torch.ones(4), seed)
    published = learning.parameters()
    assert published["obs_norm.mean"] == pytest.approx([5, -3, 1], abs=1.5)
    counters = {"update_step": 3, "version": 3, "samples_consumed": 12}
    checkpoint.save(config, "ppo", learning, counters)
    # `apexrl eval`'s own steps: the checkpoint, the agent it was trained as, its policy
    path, meta, arrays = play._checkpoint(tmp_path, latest=True)
    policy = algorithms.make(play.saved_agent(meta["config"])).policy()
    policy.load(prefixed(arrays, "online"))
    for name in ("obs_norm.mean", "obs_norm.var", "return_norm.var"):
        np.testing.assert_array_equal(policy.arrays[name], published[name])
    obs = unrolls(9)["observations"][:, 0].numpy()
    with torch.no_grad():
        expected = learning.net.policy(torch.from_numpy(obs))[:, :1].numpy()
    np.testing.assert_allclose(
        policy.act(obs, 0.0, np.random.default_rng(0)),
        np.clip(expected, -2, 2),
        rtol=1e-5,
        atol=1e-6,
    )
    # a resumed learner normalizes as the saved one did
    _, resumed = ppo_learning(tmp_path)
    assert checkpoint.resume(config, "ppo", resumed) is not None
    for name in ("mean", "var", "count"):
        torch.testing.assert_close(
            getattr(resumed.net.obs_norm, name), getattr(learning.net.obs_norm, name)
        )
    played = subprocess.run(
        [
            sys.executable,
            "-m",
            "apexrl.cli",
            "eval",
            "--checkpoint",
            str(tmp_path),
            "--latest",
            "--episodes",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert played.returncode == 0, played.stderr
    assert "Pendulum-v1, version 3" in played.stdout
