"""Several tables in one replay over real gRPC: a prioritized table next to a queue, declared
by a `[[replay.tables]]` config file; waits both ways; multi-table checkpoints."""

import os
import subprocess
import sys
import threading
import time
import urllib.request

import grpc
import numpy as np
import pytest

from apexrl.config import ReplayConfig, parse
from apexrl.replay.client import ReplayClient
from apexrl.v1 import replay_pb2
from tests.conftest import transitions

CONFIG = """
max_message_mb = 64
[replay]
checkpoint_interval = 0.0

[[replay.tables]]
name = "replay"
capacity = 1000
alpha = 0.5
min_size_to_sample = 1

[[replay.tables]]
name = "queue"
capacity = 4
sampler = "fifo"
remover = "none"
max_times_sampled = 1
rate_limiter = "queue"
signature = "x:int64:"
"""

TABLES = [
    {"name": "replay", "capacity": 1000, "alpha": 0.5, "min_size_to_sample": 1},
    {"name": "queue", "capacity": 4, "sampler": "fifo", "remover": "none",
     "max_times_sampled": 1, "rate_limiter": "queue", "signature": "x:int64:"},
]  # fmt: skip


def unrolls(first: int, n: int) -> dict[str, np.ndarray]:
    return {"x": np.arange(first, first + n, dtype=np.int64)}


def infos(client: ReplayClient, digest: bool = False) -> dict[str, replay_pb2.TableInfo]:
    response = client.stub.Info(replay_pb2.InfoRequest(include_digest=digest), timeout=30)
    return {t.name: t for t in response.tables}


def table_metric(port: int, name: str, table: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    for line in text.splitlines():
        if line.startswith(f'{name}{{table="{table}"}}'):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name}{{table={table!r}}} not in /metrics")


def test_config_file_declares_the_tables(tmp_path):
    path = tmp_path / "apexrl.toml"
    path.write_text(CONFIG)
    config = parse(ReplayConfig, ["--config", str(path)], "replay", "apexrl replay")
    settings = config.table_configs()
    assert [t.name for t in settings] == ["replay", "queue"]
    assert (settings[1].sampler, settings[1].remover, settings[1].rate_limiter) == (
        "fifo", "none", "queue",
    )  # fmt: skip
    assert settings[0].min_size_to_sample == 1 and settings[0].alpha == 0.5


def test_queue_next_to_a_prioritized_table(replay_factory):
    server = replay_factory(tables=TABLES)
    with (
        ReplayClient(server.address, table="queue", timeout=10) as queue,
        ReplayClient(server.address, table="replay", timeout=10) as replay,
    ):
        replay.insert(transitions(50))
        assert replay.sample(64).keys.max() < 50  # with replacement, from the same server
        queue.insert(unrolls(0, 3))
        queue.insert(unrolls(3, 1))
        first, second = queue.sample(2), queue.sample(2)
        # Consumed once each, in insertion order; fifo probabilities and weights are 1.
        assert first.keys.tolist() == [0, 1] and second.keys.tolist() == [2, 3]
        assert second.columns["x"].tolist() == [2, 3]
        np.testing.assert_array_equal(first.weights, 1.0)
        np.testing.assert_array_equal(first.probabilities, 1.0)
        tables = infos(queue)
        assert (tables["queue"].size, tables["queue"].removed, tables["queue"].samples) == (0, 4, 4)
        assert (tables["queue"].sampler, tables["queue"].remover) == ("fifo", "none")
        assert (tables["queue"].max_times_sampled, tables["queue"].rate_limiter) == (1, "queue")
        assert (tables["replay"].sampler, tables["replay"].rate_limiter) == ("prioritized", "ratio")
        assert (tables["replay"].size, tables["replay"].removed) == (50, 0)
        assert table_metric(server.metrics_port, "apexrl_replay_removed_total", "queue") == 4
        assert table_metric(server.metrics_port, "apexrl_replay_size", "replay") == 50
        assert table_metric(server.metrics_port, "apexrl_replay_samples_total", "replay") == 64
        # A stale key of a consumed item is ignored, not an error.
        assert queue.update_priorities(np.array([0]), np.array([1.0])).stale == 1


def test_queue_insert_waits_for_room_and_sample_waits_for_the_batch(replay_factory):
    server = replay_factory(tables=TABLES)
    with ReplayClient(server.address, table="queue", timeout=10) as queue:
        for key in range(4):  # one at a time, as actors write unrolls: full
            queue.insert(unrolls(key, 1))
        landed = {}

        def insert_when_room():
            landed["response"] = queue.insert(unrolls(4, 1))

        writer = threading.Thread(target=insert_when_room)
        writer.start()
        time.sleep(0.5)
        assert writer.is_alive() and infos(queue)["queue"].inserts == 4  # held: no room
        assert queue.sample(1).keys.tolist() == [0]  # frees slot 0 ...
        writer.join(10)
        assert landed["response"].first_key == 4  # ... and the held insert lands there
        assert queue.sample(4).keys.tolist() == [1, 2, 3, 4]

        got = {}
        with ReplayClient(server.address, table="queue", timeout=10) as learner:
            reader = threading.Thread(target=lambda: got.update(batch=learner.sample(3)))
            reader.start()
            for key in (5, 6):
                queue.insert(unrolls(key, 1))
                time.sleep(0.2)
                assert reader.is_alive()  # 1 or 2 items: the batch of 3 is not there yet
            queue.insert(unrolls(7, 1))
            reader.join(10)
        assert got["batch"].keys.tolist() == [5, 6, 7]


def test_queue_deadlines_and_refusals_change_nothing(replay_factory):
    server = replay_factory(tables=TABLES)
    with ReplayClient(server.address, table="queue", timeout=0.5, retry_seconds=0) as queue:
        with pytest.raises(grpc.RpcError) as e:
            queue.sample(1)  # empty
        assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        queue.insert(unrolls(0, 4))
        before = infos(queue, digest=True)["queue"].digest
        with pytest.raises(grpc.RpcError) as e:
            queue.insert(unrolls(4, 1), max_wait=0.3)  # full
        assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        with pytest.raises(grpc.RpcError) as e:
            queue.sample(5)  # above capacity
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "batch_size" in e.value.details()
        with pytest.raises(grpc.RpcError) as e:
            queue.sample(4)  # 4 + the insert batch of 4 > capacity + 1: could deadlock
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "batch_size" in e.value.details() and "'queue'" in e.value.details()
        assert infos(queue, digest=True)["queue"].digest == before


def test_multi_table_checkpoint_restores_exactly_in_a_fresh_process(replay_process, tmp_path):
    path, ckpt = tmp_path / "apexrl.toml", tmp_path / "ckpt"
    path.write_text(CONFIG)
    first = replay_process("--config", str(path), "--checkpoint-dir", str(ckpt), "--seed", "3")
    with (
        ReplayClient(first.address, table="queue") as queue,
        ReplayClient(first.address, table="replay") as replay,
    ):
        replay.insert(transitions(30), np.linspace(0.1, 3, 30))
        replay.sample(8)
        queue.insert(unrolls(0, 3))
        assert queue.sample(2).keys.tolist() == [0, 1]  # 0, 1 leave; 2 stays
        queue.insert(unrolls(3, 1))
        queue.checkpoint()
        before = infos(queue, digest=True)
    first.stop()
    second = replay_process("--config", str(path), "--checkpoint-dir", str(ckpt))
    with ReplayClient(second.address, table="queue") as queue:
        after = infos(queue, digest=True)
        assert {n: t.digest for n, t in after.items()} == {n: t.digest for n, t in before.items()}
        assert (after["queue"].size, after["queue"].removed) == (2, 2)
        assert queue.sample(2).keys.tolist() == [2, 3]  # goes on where it left off
    assert "restored table 'queue'" in second.log() and "restored table 'replay'" in second.log()
    second.stop()


def test_a_table_declared_twice_fails_fast_naming_it(tmp_path):
    path = tmp_path / "apexrl.toml"
    path.write_text(CONFIG + '\n[[replay.tables]]\nname = "queue"\ncapacity = 8\n')
    result = subprocess.run(
        [sys.executable, "-m", "apexrl.cli", "replay", "--port", "0", "--config", str(path)],
        capture_output=True, text=True, timeout=60, env={**os.environ, "APEXRL_METRICS_PORT": "0"},
    )  # fmt: skip
    assert result.returncode != 0
    assert "table 'queue' is declared twice" in result.stderr
