"""The learner's data path through a real table, in one process: the replay is asked for the
configured beta (the importance weights the update step gets are the table's for that beta),
and each new priority lands under the key of the item whose TD error it is."""

import copy
import queue
import threading

import numpy as np
import prometheus_client
import pytest
import torch

from apexrl import algorithms
from apexrl.algorithms.datasets import FreshQueue, Queue, Stream
from apexrl.algorithms.dqn.losses import dqn_loss
from apexrl.common.parameters import ParameterStore
from apexrl.config import LearnerConfig
from apexrl.learner.metrics import LearnerMetrics
from apexrl.learner.training import Learner
from apexrl.learner.write_back import _send_priorities, write_priorities
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
        return SampledBatch(
            result.columns, result.keys, result.probabilities, result.weights, result.table_size
        )

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
    config = LearnerConfig(
        algorithm="dqn",
        env="CartPole-v1",
        hidden="8",
        batch_size=ITEMS,
        beta=beta,
        max_updates=1,
        prefetch=1,
        threads=1,
        seed=3,
    )
    builder = algorithms.make(config)
    table = make_table(builder.tables()[0], max_batch_size=ITEMS, seed=7)
    items = transitions(np.random.default_rng(0))
    table.insert(items, priorities.astype(np.float64))
    replay = TableReplay(table)
    learner = Learner(
        config, builder, LearnerMetrics(prometheus_client.CollectorRegistry()), ParameterStore()
    )
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


# --- the update's bookkeeping and the priority senders ----------------------------------------


def learner_with(publish_interval: int, **dataset) -> tuple[Learner, list, dict]:
    """A dqn Learner whose update step returns the TD errors and figures the test gives it:
    (learner, the steps it was called with, the registry's sample of a metric)."""
    config = LearnerConfig(
        algorithm="dqn", env="CartPole-v1", hidden="8", publish_interval=publish_interval, threads=1
    )
    registry = prometheus_client.CollectorRegistry()
    learner = Learner(
        config, algorithms.make(config), LearnerMetrics(registry, {"q_mean": "q"}), ParameterStore()
    )
    for name, value in dataset.items():
        setattr(learner.dataset, name, value)
    steps = []

    def update(batch, weights, step):
        steps.append(step)
        td = None if step == 2 else torch.tensor([0.5, 1.5, 2.5, 3.5]) * step
        return td, {"loss": 10.0 * step, "q_mean": -1.0 * step}

    learner.learning.update = update
    return learner, steps, lambda name: registry.get_sample_value(f"apexrl_learner_{name}")


def test_updates_are_numbered_counted_published_and_reported():
    learner, steps, metric = learner_with(publish_interval=2)
    written: queue.Queue = queue.Queue()
    keys = np.array([10, 11, 12, 13])
    versions = []
    for weights in ([1.0, 0.5, 0.25, 1.0], [1.0, 1.0, 1.0, 1.0], [0.2, 0.4, 0.6, 0.8]):
        columns = {"version": torch.tensor([0, 1, 1, 0])}
        learner._update(columns, torch.tensor(weights), keys, written)
        versions.append(learner.store.version)
    assert steps == [1, 2, 3] and learner.update_step == 3 and learner.samples_consumed == 12
    assert versions == [1, 2, 2]  # published after every 2nd update (version 1: at start)
    assert metric("update_step") == 3 and metric("updates_total") == 3
    assert metric("samples_consumed_total") == 12
    assert (metric("loss"), metric("q_mean")) == (30.0, -3.0)
    assert metric("is_weight_mean") == pytest.approx(0.5)
    assert metric("is_weight_min") == pytest.approx(0.2)
    assert metric("policy_lag") == pytest.approx(2 - 0.5)  # the version before update 3's
    assert metric("td_error_mean") == pytest.approx(6.0)
    eps = learner.config.priority_epsilon
    sent = [written.get_nowait() for _ in range(written.qsize())]  # none for update 2
    assert [k.tolist() for k, _ in sent] == [keys.tolist()] * 2
    np.testing.assert_allclose(sent[0][1], np.array([0.5, 1.5, 2.5, 3.5]) + eps)
    np.testing.assert_allclose(sent[1][1], np.array([1.5, 4.5, 7.5, 10.5]) + eps)


def test_a_dataset_that_needs_each_version_gets_one_after_every_update():
    learner, _, _ = learner_with(publish_interval=100, publish_every_update=True)
    written: queue.Queue = queue.Queue()
    versions = []
    for _ in range(3):
        learner._update({}, torch.ones(4), np.arange(4), written)
        versions.append(learner.store.version)
    assert versions == [2, 3, 4]


def test_an_unprioritized_dataset_gets_no_priorities():
    learner, _, _ = learner_with(publish_interval=1, prioritized=False)
    written: queue.Queue = queue.Queue()
    learner._update({}, torch.ones(4), np.arange(4), written)
    assert written.empty()


class CallsReplay:
    """Records each update_priorities call, or fails it."""

    def __init__(self, fail: bool = False):
        self.fail, self.calls = fail, []

    def update_priorities(self, keys, priorities):
        if self.fail:
            raise ConnectionError("replay is gone")
        self.calls.append((keys, priorities))


class ScriptedUpdates:
    """A queue that hands out a script: an item, queue.Empty (nothing more arrived in time) or
    None (the end); records the timeout of every get."""

    def __init__(self, script):
        self.script, self.timeouts, self.put_back = list(script), [], []

    def get(self, timeout=None):
        self.timeouts.append(timeout)
        item = self.script.pop(0)
        if item is queue.Empty:
            raise queue.Empty
        return item

    def put(self, item):
        self.put_back.append(item)
        self.script.insert(0, item)


def test_a_sender_coalesces_what_arrives_within_20_ms_then_sends_it():
    one = (np.array([1, 2]), np.array([0.1, 0.2]))
    two = (np.array([3]), np.array([0.3]))
    updates = ScriptedUpdates([one, two, queue.Empty, one, None])
    replay = CallsReplay()
    sent = []
    _send_priorities(replay, updates, threading.Event(), sent.append, coalesce=16)
    assert [k.tolist() for k, _ in replay.calls] == [[1, 2, 3], [1, 2]]
    np.testing.assert_allclose(replay.calls[0][1], [0.1, 0.2, 0.3])
    assert sent == [3, 2] and updates.put_back == [None]
    first, *waits = updates.timeouts
    assert first is None  # the first update of a call: waited for as long as it takes
    coalescing = [waits[0], waits[1], waits[3]]
    assert all(0.0 <= t <= 0.02 for t in coalescing), coalescing
    assert waits[0] > 0.0  # a fresh window: time left to wait in


def test_a_failed_call_is_logged_with_its_size_and_error(caplog):
    updates = ScriptedUpdates([(np.array([1, 2]), np.array([0.1, 0.2])), None])
    sent = []
    _send_priorities(CallsReplay(fail=True), updates, threading.Event(), sent.append, 16)
    assert sent == []
    messages = [r.getMessage() for r in caplog.records]
    assert messages == ["priority update of 2 keys failed: replay is gone"]


def test_every_sender_runs_at_once_in_its_own_named_daemon_thread():
    """4 senders, 4 updates of one key, one update a call: the replay holds each call until
    all 4 are in it (so 4 threads exist), and sees the threads' names."""
    everyone = threading.Barrier(4, timeout=10)
    threads = []

    class Together(CallsReplay):
        def update_priorities(self, keys, priorities):
            threads.append(threading.current_thread())
            everyone.wait()
            super().update_priorities(keys, priorities)

    replay = Together()
    updates: queue.Queue = queue.Queue()
    for key in range(4):
        updates.put((np.array([key]), np.array([1.0])))
    updates.put(None)
    caller = threading.Thread(
        target=write_priorities,
        args=(replay, updates, threading.Event(), lambda n: None),
        kwargs={"coalesce": 1, "senders": 4},
        name="caller",
    )
    caller.start()
    caller.join(20)
    assert sorted(k.item() for k, _ in replay.calls) == [0, 1, 2, 3]
    others = [t for t in threads if t.name != "caller"]
    assert sorted(t.name for t in others) == ["priorities-1", "priorities-2", "priorities-3"]
    assert all(t.daemon for t in others)
