"""The learner's data path through a real table, in one process: the replay is asked for the
configured beta (the importance weights the update step gets are the table's for that beta),
and each new priority lands under the key of the item whose TD error it is."""

import copy
import threading

import numpy as np
import prometheus_client
import pytest
import torch

from apexrl import algorithms
from apexrl.algorithms.datasets import FreshQueue, Queue, Stream
from apexrl.algorithms.dqn.losses import dqn_loss
from apexrl.config import LearnerConfig
from apexrl.learner.metrics import LearnerMetrics
from apexrl.learner.parameters import ParameterStore
from apexrl.learner.training import Learner
from apexrl.replay.client import SampledBatch
from apexrl.replay.server import make_table, table_info

ITEMS = 16


class TableReplay:
    """The replay verbs the learner calls, answered by a real Table in this process; records
    the beta of every sample request."""

    def __init__(self, table):
        self.table, self.betas = table, []

    def info(self):
        return table_info(self.table)

    def sample(self, batch_size: int, beta: float) -> SampledBatch:
        self.betas.append(beta)
        result = self.table.sample(batch_size, beta)
        return SampledBatch(result.columns, result.keys, result.probabilities, result.weights,
                            result.table_size)  # fmt: skip

    def sample_stream(self, batch_size: int, beta: float):
        while True:
            yield self.sample(batch_size, beta)

    def update_priorities(self, keys, priorities):
        self.table.update_priorities(keys, priorities)


@pytest.fixture(autouse=True)
def restore_threads():
    """The Learner sets torch's threads from its config (1 here): the other tests get theirs back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def transitions(rng) -> dict[str, np.ndarray]:
    """CartPole n-step transitions whose rewards all differ (so do their TD errors); item 5's
    reward is far above the others'."""
    reward = np.arange(ITEMS, dtype=np.float32) * 0.1
    reward[5] = 50.0
    return {
        "obs": rng.standard_normal((ITEMS, 4)).astype(np.float32),
        "action": rng.integers(0, 2, ITEMS),
        "reward": reward,
        "discount": np.full(ITEMS, 0.9, np.float32),
        "next_obs": rng.standard_normal((ITEMS, 4)).astype(np.float32),
    }


def trained_once(beta: float, priorities: np.ndarray):
    """A dqn Learner that made one update of a batch sampled from a table of `transitions` with
    initial `priorities`: (learner, replay, items, networks before the update, the batch and
    weights the update step got)."""
    config = LearnerConfig(algorithm="dqn", env="CartPole-v1", hidden="8", batch_size=ITEMS,
                           beta=beta, max_updates=1, prefetch=1, threads=1, seed=3)  # fmt: skip
    builder = algorithms.make(config)
    table = make_table(builder.tables()[0], max_batch_size=ITEMS, seed=7)
    items = transitions(np.random.default_rng(0))
    table.insert(items, priorities.astype(np.float64))
    replay = TableReplay(table)
    learner = Learner(config, builder, LearnerMetrics(prometheus_client.CollectorRegistry()),
                      ParameterStore())  # fmt: skip
    before = copy.deepcopy(learner.learning.online), copy.deepcopy(learner.learning.target)
    seen = []
    update = learner.learning.update

    def recording(batch, weights, step):
        seen.append(({k: v.clone() for k, v in batch.items()}, weights.clone()))
        return update(batch, weights, step)

    learner.learning.update = recording
    trainer = threading.Thread(target=learner.train, args=(replay,))
    trainer.start()
    trainer.join(30)
    learner.stop.set()
    for helper in learner.helpers:
        helper.join(5)
    assert not trainer.is_alive() and learner.update_step == 1
    return learner, replay, items, before, seen[0]


def test_each_new_priority_is_written_under_its_own_items_key():
    """Item 5's large reward gives it the largest TD error: after one update its key holds the
    largest priority, and every key sampled holds its own item's |TD error| + epsilon."""
    initial = np.ones(ITEMS)
    initial[5] = 1000.0  # sampled with near certainty
    learner, replay, items, (online, target), _ = trained_once(0.4, initial)
    batch = {name: torch.from_numpy(a) for name, a in items.items()}
    _, td, _ = dqn_loss(online, target, batch, torch.ones(ITEMS))
    want = td.abs().numpy() + learner.config.priority_epsilon
    stored = replay.table.priorities[:ITEMS]
    written = stored != initial  # the items sampled: a new priority each
    assert written[5] and written.sum() >= 4
    np.testing.assert_allclose(stored[written], want[written], rtol=1e-5)
    assert stored.argmax() == 5


def test_the_update_step_gets_the_importance_weights_of_the_configured_beta():
    """Priorities 1..16 make P(i) uneven: the weight of each item the update step gets is
    (min_batch P / P(i))^beta for the configured beta (beta 0 would make them all 1)."""
    initial = np.arange(1.0, ITEMS + 1)
    _, replay, items, _, (batch, weights) = trained_once(0.7, initial)
    assert replay.betas and set(replay.betas) == {0.7}
    # Rewards tell the items apart: which item each row of the batch is.
    rows = np.abs(batch["reward"].numpy()[:, None] - items["reward"][None]).argmin(1)
    p = initial**replay.table.alpha
    p_batch = p[rows] / p.sum()
    want = (p_batch.min() / p_batch) ** 0.7
    np.testing.assert_allclose(weights.numpy(), want, rtol=1e-5)
    assert weights.min() < 0.9


class RecordingReplay:
    def __init__(self):
        self.betas = []

    def sample(self, batch_size, beta):
        self.betas.append(beta)
        return batch_size

    def sample_stream(self, batch_size, beta):
        self.betas.append(beta)
        return iter([batch_size])


@pytest.mark.parametrize("dataset", [Stream("t"), Queue("t"), FreshQueue("t")])
def test_every_dataset_asks_the_replay_for_the_beta_it_is_given(dataset):
    replay = RecordingReplay()
    next(iter(dataset.batches(replay, 4, 0.7, threading.Event())))
    assert replay.betas == [0.7]
