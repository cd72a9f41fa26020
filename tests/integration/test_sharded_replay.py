"""Replay shards over real gRPC (in-process servers on port 0): keys that name their shard, global
proportional sampling and weights, shards going down and coming back, and bad shard sets."""

import threading

import grpc
import numpy as np
import pytest
from scipy import stats

from apexrl.replay import keys as keyspace
from apexrl.replay.client import ReplayClient
from apexrl.replay.sharded import ShardedReplayClient, connect
from apexrl.replay.shards import ShardError, Shards
from apexrl.v1 import replay_pb2
from tests.conftest import checkpoint_digest, transitions, wait_for

ALPHA = 0.6


def shards(replay_factory, n: int = 3, **settings) -> list:
    return [replay_factory(shard=str(i), seed=100 + i, **settings) for i in range(n)]


def sharded(servers, **kwargs) -> ShardedReplayClient:
    kwargs.setdefault("timeout", 10.0)
    kwargs.setdefault("retry_seconds", 5.0)
    return ShardedReplayClient(",".join(s.address for s in servers), **kwargs)


def digests(servers) -> list[str]:
    return [s.table.digest() for s in servers]


def test_keys_carry_the_shard_and_a_foreign_key_is_refused(replay_factory):
    server = replay_factory(shard="2")
    with server.client() as client:
        ack = client.insert(transitions(10))
        assert ack.first_key == 2 << keyspace.SHARD_SHIFT
        batch = client.sample(8)
        assert set(keyspace.shard_of(batch.keys)) == {2}
        response = client.update_priorities(batch.keys, np.full(8, 5.0))
        assert response.updated == 8
        info = client.stub.Info(replay_pb2.InfoRequest(), timeout=5)
        assert info.shard == 2
        before = server.table.digest()
        foreign = np.array([ack.first_key, (1 << keyspace.SHARD_SHIFT) | 3])
        with pytest.raises(grpc.RpcError) as err:
            client.update_priorities(foreign, np.ones(2))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "keys[1]" in err.value.details() and "shard 1" in err.value.details()
    assert server.table.digest() == before


def fill_skewed(client: ReplayClient, shard: int, count: int, offset: int) -> np.ndarray:
    """`count` items with skewed priorities (a few dominate); returns the priorities."""
    priorities = np.exp(np.linspace(-3, 3, count) + shard) * (1 + np.arange(count) % 5)
    client.insert(transitions(count, start=offset), priorities)
    return priorities


def test_sampling_is_globally_proportional_with_single_table_weights(replay_factory):
    servers = shards(replay_factory)
    counts, priorities, keys = [40, 90, 20], [], []
    for shard, (server, count) in enumerate(zip(servers, counts, strict=True)):
        with server.client() as client:
            p = fill_skewed(client, shard, count, sum(counts[:shard]))
        priorities.append(p)
        keys.append(keyspace.with_shard(np.arange(count), shard))
    all_keys, all_p = np.concatenate(keys), np.concatenate(priorities)
    expected = all_p**ALPHA / (all_p**ALPHA).sum()
    by_key = dict(zip(all_keys.tolist(), range(len(all_keys)), strict=True))
    seen = np.zeros(len(all_keys))
    beta = 0.5
    with sharded(servers, seed=7) as client:
        for _ in range(300):
            batch = client.sample(64, beta)
            index = np.array([by_key[k] for k in batch.keys.tolist()])
            np.add.at(seen, index, 1)
            # The probabilities and weights one table holding all 150 items gives.
            np.testing.assert_allclose(batch.probabilities, expected[index], rtol=1e-9)
            raw = (len(all_keys) * expected[index]) ** -beta
            np.testing.assert_allclose(batch.weights, raw / raw.max(), rtol=1e-6)
            assert batch.table_size == len(all_keys)
            # Each row is the row inserted under its key.
            np.testing.assert_array_equal(batch.columns["obs"][:, 0], index)
    chi2 = stats.chisquare(seen, expected * seen.sum())
    print(
        f"3 shards, {int(seen.sum())} samples: chi-square {chi2.statistic:.1f}, p {chi2.pvalue:.3f}"
    )
    assert chi2.pvalue > 0.01
    # The shards' share follows their mass, not their item count.
    per_shard = [seen[sum(counts[:s]) : sum(counts[: s + 1])].sum() for s in range(3)]
    mass = [expected[sum(counts[:s]) : sum(counts[: s + 1])].sum() for s in range(3)]
    np.testing.assert_allclose(np.array(per_shard) / seen.sum(), mass, atol=0.02)


@pytest.mark.parametrize(("batch_size", "draws"), [(1, 900), (2, 450), (64, 15)])
def test_sampling_follows_the_mass_of_every_live_shard_through_priority_updates(
    replay_factory, monkeypatch, batch_size, draws
):
    """4 shards, one of them empty, priorities rewritten between samples: every batch's
    probabilities and weights are those of one table holding every item at that moment (a
    batch of 1 or 2 touches one or two shards: their mass is not the whole), and the items
    drawn follow those probabilities (chi-square over the sum of the distributions drawn
    from). The client's view of each shard's mass is refreshed before every sample here, as
    an update changes it; in service it may lag by VIEW_SECONDS."""
    monkeypatch.setattr(Shards, "VIEW_SECONDS", 0.0)
    servers = shards(replay_factory, 4)
    counts = [12, 20, 8, 0]  # shard 3 stays empty
    rng = np.random.default_rng(batch_size)
    priorities = rng.uniform(0.5, 20.0, sum(counts))
    keys = []
    for shard, (server, count) in enumerate(zip(servers, counts, strict=True)):
        if count:
            start = sum(counts[:shard])
            with server.client() as client:
                client.insert(transitions(count, start=start), priorities[start : start + count])
        keys.append(keyspace.with_shard(np.arange(count), shard))
    all_keys = np.concatenate(keys)
    by_key = dict(zip(all_keys.tolist(), range(len(all_keys)), strict=True))
    seen, drawn_from = np.zeros(len(all_keys)), np.zeros(len(all_keys))
    beta = 0.4
    with sharded(servers, seed=batch_size) as client:
        for draw in range(draws):
            if draw and draw % max(1, draws // 6) == 0:  # a share of the items, any shard
                changed = rng.choice(len(all_keys), 10, replace=False)
                priorities[changed] = rng.uniform(0.5, 20.0, 10)
                client.update_priorities(all_keys[changed], priorities[changed])
            expected = priorities**ALPHA / (priorities**ALPHA).sum()
            batch = client.sample(batch_size, beta)
            index = np.array([by_key[k] for k in batch.keys.tolist()])
            np.testing.assert_allclose(batch.probabilities, expected[index], rtol=1e-9)
            raw = (len(all_keys) * expected[index]) ** -beta
            np.testing.assert_allclose(batch.weights, raw / raw.max(), rtol=1e-6)
            assert batch.table_size == len(all_keys)
            np.testing.assert_array_equal(batch.columns["obs"][:, 0], index)
            np.add.at(seen, index, 1)
            drawn_from += batch_size * expected
    chi2 = stats.chisquare(seen, drawn_from)
    print(f"batch {batch_size}: {int(seen.sum())} samples, chi-square p {chi2.pvalue:.3f}")
    assert chi2.pvalue > 0.001


def test_inserts_spread_and_updates_go_to_the_owner(replay_factory):
    servers = shards(replay_factory)
    with sharded(servers) as client:
        acks = [client.insert(transitions(10, start=10 * i)) for i in range(6)]
        owners = keyspace.shard_of(np.array([a.first_key for a in acks]))
        assert sorted(owners) == [0, 0, 1, 1, 2, 2]
        assert [s.table.size for s in servers] == [20, 20, 20]
        batch = client.sample(60)
        response = client.update_priorities(batch.keys, np.full(60, 9.0))
        assert response.updated == 60 and response.stale == 0
        for server in servers:
            mine = batch.keys[keyspace.shard_of(batch.keys) == int(server.servicer.shard)]
            slots = mine & keyspace.SEQUENCE_MASK
            server.table.apply_priorities()  # the server writes after its answer
            assert np.all(server.table.priorities[slots] == 9.0)
        info = client.info()
        assert (info.size, info.inserts) == (60, 60)


def test_a_shard_down_is_left_out_and_rejoins(replay_factory, tmp_path):
    from tests.conftest import in_process_replay

    servers = shards(replay_factory, 2)
    with in_process_replay(tmp_path, shard="2", seed=3) as third:
        port = third.address.rsplit(":", 1)[1]
        with third.client() as c:
            c.insert(transitions(30), np.full(30, 50.0))  # most of the mass
        address = ",".join([*(s.address for s in servers), third.address])
        client = ShardedReplayClient(address, timeout=5.0, retry_seconds=5.0, seed=1)
        for server in servers:
            with server.client() as c:
                c.insert(transitions(30), np.ones(30))
        batch = client.sample(200)
        assert 2 in set(keyspace.shard_of(batch.keys))
        held = batch.keys[keyspace.shard_of(batch.keys) == 2][:5]
    # Shard 2 is gone: samples come from the others, probabilities renormalized over them.
    batch = client.sample(200)
    assert set(keyspace.shard_of(batch.keys)) <= {0, 1}
    assert batch.probabilities == pytest.approx(np.full(200, 1 / 60))
    assert batch.table_size == 60
    acks = [client.insert(transitions(4)) for _ in range(4)]
    assert set(keyspace.shard_of(np.array([a.first_key for a in acks]))) == {0, 1}
    response = client.update_priorities(held, np.ones(len(held)))
    assert response.stale == len(held) and client.dropped_priority_updates == len(held)
    # Back on the same port (empty: no checkpoint here), it rejoins.
    with in_process_replay(tmp_path, shard="2", port=int(port)) as back:
        with back.client() as c:
            c.insert(transitions(10), np.full(10, 1000.0))
        wait_for(lambda: 2 in set(keyspace.shard_of(client.sample(100).keys)), 15,
                 "shard 2 to rejoin")  # fmt: skip
    client.close()


def test_bad_shard_sets_are_refused_naming_the_shard(replay_factory):
    a = replay_factory(shard="0")
    b = replay_factory(shard="2")  # listed second: should be shard 1
    with pytest.raises(ShardError, match=r"shard 1 \(.*\) answers as shard 2"):
        sharded([a, b]).sample(1)
    c = replay_factory(shard="1", signature="obs:float32:4,action:int64:")
    d = replay_factory(shard="0", signature="obs:float32:8,action:int64:")
    with pytest.raises(ShardError, match="replay shard 1 .*signature"):
        sharded([d, c]).info()
    e = replay_factory(shard="1", alpha=0.9)
    with pytest.raises(ShardError, match="replay shard 1 .*alpha 0.9"):
        sharded([a, e]).info()
    f = replay_factory(shard="1")
    with sharded([a, f]) as client:
        client.insert(transitions(10))
        before = digests([a, f])
        bad = np.array([5, (7 << keyspace.SHARD_SHIFT) | 1])
        with pytest.raises(ShardError, match=r"keys\[1\] = .* names shard 7"):
            client.update_priorities(bad, np.ones(2))
        assert digests([a, f]) == before


def test_connect_picks_the_client_and_hostname_shards():
    assert isinstance(connect("127.0.0.1:1"), ReplayClient)
    assert isinstance(connect("127.0.0.1:1,127.0.0.1:2"), ShardedReplayClient)
    assert isinstance(connect("dns:///localhost:1"), ShardedReplayClient)
    assert keyspace.parse_shard("hostname", "replay-12") == 12
    assert keyspace.parse_shard("3") == 3
    for bad in ("-1", "40000", "x"):
        with pytest.raises(ValueError, match="shard"):
            keyspace.parse_shard(bad)
    with pytest.raises(ValueError, match="does not end in"):
        keyspace.parse_shard("hostname", "replay")


def test_a_shard_killed_mid_training_restarts_from_its_checkpoint_and_rejoins(
    service_process, tmp_path
):
    from apexrl.common.learner_client import LearnerClient

    def start_shard(i: int, *extra: str):
        return service_process(
            "replay", "--shard", str(i), "--min-size-to-sample", "64",
            "--checkpoint-dir", str(tmp_path / f"shard-{i}"), "--checkpoint-interval", "1", *extra,
        )  # fmt: skip

    replays = [start_shard(i) for i in range(3)]
    addresses = ",".join(r.address for r in replays)
    learner = service_process("learner", "--replay", addresses, "--batch-size", "32")
    actor = service_process("actor", "--replay", addresses, "--learner", learner.address,
                            "--num-envs", "2", "--insert-batch", "16")  # fmt: skip

    def counters(replay) -> tuple[int, int]:
        with ReplayClient(replay.address, timeout=5, retry_seconds=5) as client:
            info = client.info()
        return info.inserts, info.samples

    with LearnerClient(learner.address) as learner_client:
        step = lambda: learner_client.get_parameters().update_step  # noqa: E731
        wait_for(lambda: step() >= 20, 90, "training on 3 shards")
        wait_for(lambda: all(counters(r)[1] > 0 for r in replays), 30, "every shard sampled")
        wait_for(lambda: checkpointed_inserts(tmp_path / "shard-1") > 0, 60,
                 "a checkpoint of shard 1 holding items")  # fmt: skip
        replays[1].kill()
        # Training goes on with shards 0 and 2: both take inserts and are sampled.
        before = [counters(replays[i]) for i in (0, 2)]
        at_kill = step()
        wait_for(lambda: step() > at_kill + 20, 60, "updates with shard 1 down")
        after = [counters(replays[i]) for i in (0, 2)]
        assert all(a[0] > b[0] and a[1] > b[1] for a, b in zip(after, before, strict=True))
        assert learner.process.poll() is None and actor.process.poll() is None
        # Restarted on a port no client knows (no traffic can change it), it holds exactly
        # its newest checkpoint.
        saved = checkpoint_digest(tmp_path / "shard-1")
        aside = start_shard(1)
        with ReplayClient(aside.address, timeout=30, retry_seconds=5) as client:
            assert table_digest(client) == saved
        aside.kill()  # before its next periodic checkpoint matters: it is the same table
        back = start_shard(1, "--port", replays[1].address.rsplit(":", 1)[1])
        restored = counters(back)
        assert restored[0] > 0
        wait_for(lambda: (c := counters(back))[0] > restored[0] and c[1] > restored[1], 60,
                 "shard 1 to rejoin (inserts and samples)")  # fmt: skip
    for proc in (actor, learner, replays[0], replays[2], back):
        proc.stop()


def checkpointed_inserts(directory) -> int:
    """Inserts the newest replay checkpoint in `directory` counts (0: none yet)."""
    from apexrl.replay import checkpoint

    found = checkpoint.load_newest(directory) if directory.exists() else None
    return 0 if found is None else found[1][0].inserts


def table_digest(client: ReplayClient) -> str:
    info = client.stub.Info(replay_pb2.InfoRequest(include_digest=True), timeout=30)
    return info.tables[0].digest


def test_a_dns_name_finds_its_shards_by_their_info(replay_factory):
    """dns:///name:port: every address the name resolves to is asked for its shard id (here
    localhost, one shard on 127.0.0.1; a ::1 answer, if any, is a shard that is down)."""
    server = replay_factory(shard="3")
    port = server.address.rsplit(":", 1)[1]
    with connect(f"dns:///localhost:{port}", timeout=5.0, retry_seconds=5.0) as client:
        ack = client.insert(transitions(5))
        assert keyspace.shard_of(np.array([ack.first_key]))[0] == 3
        batch = client.sample(4)
        assert client.update_priorities(batch.keys, np.ones(4)).updated == 4
        assert list(client.shard_infos()) == [3]


def test_an_insert_a_shards_rate_limiter_holds_moves_to_another_shard(replay_factory):
    limits = dict(min_size_to_sample=10, samples_per_insert=1.0, error_buffer=10.0)
    full = replay_factory(shard="0", **limits)
    free = replay_factory(shard="1", **limits)
    with full.client() as client:
        client.insert(transitions(20))  # diff 20 = 1 x 10 + 10: no more inserts until sampled
    with sharded([full, free], timeout=3.0) as client:
        acks = [client.insert(transitions(4)) for _ in range(4)]
    assert set(keyspace.shard_of(np.array([a.first_key for a in acks]))) == {1}
    assert (full.table.size, free.table.size) == (20, 16)


def test_a_stream_waits_past_the_deadline_for_a_shard_below_its_minimum(replay_factory):
    """A learner's stream over shards still filling: each Sample the rate limiter holds past
    the client's deadline is asked again, and the stream yields once the shards fill."""
    servers = shards(replay_factory, 2, min_size_to_sample=10)
    with sharded(servers, timeout=0.3) as client:
        stream = client.sample_stream(4, max_batches=1)
        with servers[0].client() as writer:
            writer.insert(transitions(5))  # under the minimum: samples wait
            with pytest.raises(grpc.RpcError) as held:
                client.sample(4)
            assert held.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            timer = threading.Timer(1.0, lambda: [writer.insert(transitions(10)) for _ in "ab"])
            timer.start()
            try:
                batches = list(stream)
            finally:
                timer.join()
    assert len(batches) == 1 and len(batches[0].keys) == 4
