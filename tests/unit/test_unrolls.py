"""impala's and ppo's acting side: unrolls, step targets at episode ends, the policy's samples."""

import numpy as np
import pytest
import torch
from scipy import stats

from apexrl import algorithms
from apexrl.algorithms.actor_critic import ActorCriticNetwork, ActorCriticPolicy
from apexrl.algorithms.adders.unroll import UnrollAdder, step_targets
from apexrl.config import LearnerConfig


def test_unrolls_are_consecutive_steps_with_the_next_observation_last():
    adder = UnrollAdder(num_envs=2, length=3, obs_shape=(1,), obs_dtype=np.float32)
    items = []
    for t in range(7):
        obs = np.array([[10.0 * t], [10.0 * t + 1]], np.float32)
        item = adder.record(obs, np.array([t, t + 1]), np.full(2, -0.5), np.full(2, float(t)),
                         np.full(2, 0.9), obs + 10, version=100 + t)  # fmt: skip
        assert adder.at_boundary == (item is not None)
        if item is not None:
            items.append(item)
    assert len(items) == 2  # steps 0-2 and 3-5; step 6 is pending
    first, second = items
    np.testing.assert_array_equal(
        first["observations"][:, :, 0], [[0, 10, 20, 30], [1, 11, 21, 31]]
    )
    np.testing.assert_array_equal(second["observations"][0, :, 0], [30, 40, 50, 60])
    np.testing.assert_array_equal(first["actions"], [[0, 1, 2], [1, 2, 3]])
    np.testing.assert_array_equal(second["rewards"][1], [3, 4, 5])
    np.testing.assert_array_equal(first["version"], [102, 102])  # the version of its last step
    assert first["observations"].shape == (2, 4, 1) and first["discounts"].dtype == np.float32


def test_step_targets_cut_at_ends_and_bootstrap_truncations():
    rewards = np.array([1.0, 1.0, 1.0, 1.0])
    ends = np.array([False, True, False, True])
    truncated = np.array([False, False, True, True])  # the last: terminal wins
    finals = np.arange(4, dtype=np.float32)[:, None]
    asked = []

    def values(obs):
        asked.append(obs.copy())
        return obs[:, 0] * 10

    out, discounts = step_targets(rewards, ends, truncated, finals, values, 0.5)
    np.testing.assert_allclose(out, [1, 1, 1 + 0.5 * 20, 1])
    np.testing.assert_allclose(discounts, [0.5, 0, 0, 0])
    assert len(asked) == 1 and asked[0].tolist() == [[2.0]]


def test_policy_samples_follow_its_probabilities_and_report_their_log_probs():
    torch.manual_seed(0)
    net = ActorCriticNetwork((3,), np.float32, 4, (8,))
    policy = ActorCriticPolicy(net)
    obs = np.tile(np.array([[0.3, -1.0, 2.0]], np.float32), (20_000, 1))
    actions, extras = policy.step(obs, 1.0, np.random.default_rng(1))
    log_probs = extras["log_probs"]
    with torch.no_grad():
        expected = torch.softmax(net(torch.from_numpy(obs[:1]))[0], 1)[0].numpy()
    counts = np.bincount(actions, minlength=4)
    expected = expected.astype(np.float64)
    expected /= expected.sum()
    assert stats.chisquare(counts, expected * len(obs)).pvalue > 0.001
    np.testing.assert_allclose(log_probs, np.log(expected)[actions], rtol=1e-5)
    greedy = policy.act(obs[:2], 0.0, np.random.default_rng(0))
    assert (greedy == expected.argmax()).all()


@pytest.mark.parametrize("obs_shape, obs_dtype, shared", [((4, 84, 84), np.uint8, True),
                                                          ((3,), np.float32, False)])  # fmt: skip
def test_the_value_loss_trains_the_policys_features_on_images_only(obs_shape, obs_dtype, shared):
    """One conv torso under both heads (SB3's CnnPolicy, IMPALA's network); two MLPs."""
    torch.manual_seed(0)
    net = ActorCriticNetwork(obs_shape, obs_dtype, 6, (8,))
    obs = torch.from_numpy(
        np.random.default_rng(0).integers(0, 255, (5, *obs_shape)).astype(obs_dtype)
    )
    logits, values = net(obs)
    torch.testing.assert_close((logits, values), (net.policy(obs), net.values(obs)))
    values.square().sum().backward()
    reached = [
        p.grad is not None and bool(p.grad.abs().sum() > 0) for p in net.policy_torso.parameters()
    ]
    assert all(reached) if shared else not any(reached)
    names = {name.split(".")[0] for name in net.state_dict()}
    assert names == ({"policy_torso", "logits", "value"} | (set() if shared else {"value_torso"}))


@pytest.mark.parametrize("name", ["impala", "ppo"])
def test_on_policy_algorithms_learn_from_a_batch_of_unrolls(name):
    settings = algorithms.get(name).Settings(unroll_length=5)
    if name == "ppo":
        settings.epochs, settings.minibatches = 2, 2
    config = LearnerConfig(algorithm=name, hidden="16", algo=settings)
    algorithm = algorithms.make(config)
    dataset = algorithm.dataset()
    assert not dataset.prioritized and dataset.publish_every_update == (name == "ppo")
    columns = {c.name: c for c in algorithm.columns()}
    assert columns["observations"].shape == (6, 4) and columns["version"].shape == ()
    learning = algorithm.learning(config, torch.device("cpu"))
    rng = np.random.default_rng(0)
    batch = {
        "observations": torch.from_numpy(rng.standard_normal((3, 6, 4)).astype(np.float32)),
        "actions": torch.from_numpy(rng.integers(0, 2, (3, 5))),
        "rewards": torch.ones(3, 5),
        "discounts": torch.full((3, 5), 0.99),
        "log_probs": torch.full((3, 5), float(np.log(0.5))),
        "version": torch.ones(3, dtype=torch.int64),
    }
    before = {k: v.copy() for k, v in learning.parameters().items()}
    priorities, figures = learning.update(batch, torch.ones(3), 1)
    assert priorities is None and np.isfinite(figures["loss"])
    assert set(algorithm.metrics.figures) <= set(figures)  # every declared figure is reported
    after = learning.parameters()
    assert any(not np.array_equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize(
    "algorithm,table,message",
    [
        ("dqn", dict(sampler="fifo", remover="none", max_times_sampled=1),
         "sampler is 'fifo', algorithm dqn needs 'prioritized'"),
        ("ppo", dict(sampler="fifo", remover="fifo", max_times_sampled=0),
         "remover is 'fifo', algorithm ppo needs 'none'"),
        ("impala", dict(sampler="fifo", remover="none", max_times_sampled=2),
         "max_times_sampled is 2, algorithm impala needs 1"),
        ("dqn", dict(alpha=0.5), "alpha is 0.5, algorithm dqn needs 0.6"),
    ],
)  # fmt: skip
def test_a_learner_refuses_a_table_of_the_wrong_kind_naming_it(algorithm, table, message):
    from apexrl.learner.replay_checks import check_table
    from apexrl.v1 import replay_pb2, tensor_pb2

    builder = algorithms.make(LearnerConfig(algorithm=algorithm))
    (want,) = builder.tables()
    fits = dict(sampler=want.sampler, remover=want.remover,
                max_times_sampled=want.max_times_sampled, rate_limiter=want.rate_limiter,
                alpha=want.alpha)  # fmt: skip
    info = replay_pb2.TableInfo(name="default", **(fits | table))
    with pytest.raises(ValueError, match=f"replay table 'default': {message}"):
        check_table(builder, info)
    check_table(builder, replay_pb2.TableInfo(name="default", **fits))  # no error
    wrong = replay_pb2.TableInfo(name="default", **fits)
    wrong.signature.add(name="obs", dtype=tensor_pb2.FLOAT32, shape=[3])
    with pytest.raises(ValueError, match="the table's columns differ"):
        check_table(builder, wrong)
