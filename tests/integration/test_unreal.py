"""UNREAL's three tables on one real replay server: each refuses another table's items naming
the column, and a learner joins a batch of each auxiliary table to every update."""

import threading

import grpc
import numpy as np
import prometheus_client
import pytest

from apexrl import algorithms
from apexrl.algorithms.columns import pack
from apexrl.algorithms.unreal.builder import Settings
from apexrl.common.parameters import ParameterStore
from apexrl.config import LearnerConfig
from apexrl.learner.metrics import LearnerMetrics
from apexrl.learner.training import Learner
from apexrl.local.settings import replay_tables
from apexrl.replay.client import ReplayClient

SETTINGS = dict(pc_lambda=0.0, unroll_length=4, sequence_length=3, replay_batch=4)


def items(builder, table: str, n: int, seed: int = 0) -> dict[str, np.ndarray]:
    """n items of `table`'s columns, random, rewards in {-1, 0, 1}, discounts 0.99."""
    rng = np.random.default_rng(seed)
    out = {}
    for column in builder.table_columns(table):
        shape = (n, *column.shape)
        if np.issubdtype(column.dtype, np.integer):
            out[column.name] = rng.integers(0, 2, shape).astype(column.dtype)
        else:
            out[column.name] = rng.standard_normal(shape).astype(column.dtype)
    for name in ("rewards", "reward"):
        if name in out:
            out[name] = rng.integers(-1, 2, out[name].shape).astype(np.float32)
    if "discounts" in out:
        out["discounts"][:] = 0.99
    return pack(out, builder.table_columns(table))


def test_each_table_refuses_the_others_items_naming_the_column(replay_factory):
    config = LearnerConfig(algorithm="unreal", algo=Settings(**SETTINGS))
    builder = algorithms.make(config)
    names = [t.name for t in builder.tables()]
    assert names == ["default", "experience", "rewards"]
    server = replay_factory(tables=replay_tables(config, 1))
    for name in names:
        with ReplayClient(server.address, table=name, timeout=10, retry_seconds=0) as client:
            for other in names:
                if other == name:
                    continue
                with pytest.raises(grpc.RpcError) as refused:
                    client.insert(items(builder, other, 2))
                assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "batch.columns" in refused.value.details(), refused.value.details()
            assert client.info().size == 0  # nothing changed
            client.insert(items(builder, name, 2))
            assert client.info().size == 2


def test_a_learner_trains_on_the_queue_with_a_batch_of_each_auxiliary_table(replay_factory):
    config = LearnerConfig(
        algorithm="unreal", batch_size=2, max_updates=5, algo=Settings(**SETTINGS)
    )
    server = replay_factory(tables=replay_tables(config, 1))
    config.replay = server.address
    builder = algorithms.make(config)
    registry = prometheus_client.CollectorRegistry()
    learner = Learner(
        config, builder, LearnerMetrics(registry, builder.metrics.figures), ParameterStore()
    )
    seen: list[set] = []
    update = learner.learning.update

    def recording(batch, weights, step):
        seen.append(set(batch))
        return update(batch, weights, step)

    learner.learning.update = recording
    with ReplayClient(server.address, timeout=10) as queue:
        for table in ("experience", "rewards"):
            with ReplayClient(server.address, table=table, timeout=10) as client:
                client.insert(items(builder, table, 8, seed=1), np.ones(8))
        for i in range(10):
            queue.insert(items(builder, "default", 1, seed=i))
        training = threading.Thread(target=learner.train, args=(queue,))
        training.start()
        training.join(60)
        learner.stop.set()
    assert not training.is_alive()
    assert learner.update_step == 5 and len(seen) == 5
    assert {"observations", "experience/observations", "rewards/reward"} <= seen[0]
    losses = {
        name: registry.get_sample_value(f"apexrl_learner_{name}") for name in ("rp_loss", "vr_loss")
    }
    assert all(value and value > 0 for value in losses.values()), losses


def test_a_learner_refuses_a_replay_without_a_table_its_builder_names(replay_factory):
    config = LearnerConfig(algorithm="unreal", algo=Settings(**SETTINGS))
    tables = [t for t in replay_tables(config, 1) if t["name"] != "rewards"]
    server = replay_factory(tables=tables)
    config.replay = server.address
    builder = algorithms.make(config)
    registry = prometheus_client.CollectorRegistry()
    learner = Learner(
        config, builder, LearnerMetrics(registry, builder.metrics.figures), ParameterStore()
    )
    with ReplayClient(server.address, timeout=10) as queue:
        with pytest.raises(KeyError, match="has no table 'rewards'"):
            learner.train(queue)
    assert learner.update_step == 0
