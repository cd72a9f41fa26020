"""`apexrl replay` as a real process: SIGTERM, hard kills, checkpoints, config sources."""

import os
import signal
import threading

import grpc
import numpy as np

from apexrl.replay.checkpoint import checkpoints
from apexrl.replay.client import ReplayClient
from apexrl.v1 import replay_pb2
from tests.conftest import transitions, wait_for


def digest(client: ReplayClient) -> str:
    return (
        client.stub.Info(replay_pb2.InfoRequest(include_digest=True), timeout=30).tables[0].digest
    )


def test_sigterm_releases_waiters_checkpoints_and_exits_zero(replay_process, tmp_path):
    ckpt = tmp_path / "ckpt"
    proc = replay_process("--checkpoint-dir", str(ckpt), "--min-size-to-sample", "1000")
    outcome = {}
    with ReplayClient(proc.address, timeout=60, retry_seconds=0) as client:
        client.insert(transitions(100))
        expected = digest(client)

        def blocked_sample():
            try:
                client.sample(8)
            except grpc.RpcError as err:
                outcome["code"] = err.code()

        sampler = threading.Thread(target=blocked_sample)
        sampler.start()
        wait_for(lambda: "rate_limiter_wait" in proc.log() or _waiting(proc), 10, "sampler to wait")
        proc.stop()
        sampler.join(10)
    assert outcome["code"] == grpc.StatusCode.UNAVAILABLE
    assert len(checkpoints(ckpt)) == 1
    assert "stopped" in proc.log()
    restarted = replay_process("--checkpoint-dir", str(ckpt))
    with ReplayClient(restarted.address) as client:
        assert digest(client) == expected
    assert "restored table 'default'" in restarted.log()


def _waiting(proc) -> bool:
    """Whether the server's rate limiter holds a sample (read from /metrics)."""
    import urllib.request

    url = f"http://127.0.0.1:{proc.metrics_port}/metrics"
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    return 'grpc_server_started_total{grpc_method="Sample"' in text


def test_restore_after_kill_9_equals_last_checkpoint(replay_process, tmp_path):
    ckpt = tmp_path / "ckpt"
    flags = ("--checkpoint-dir", str(ckpt), "--capacity", "500", "--checkpoint-interval", "0")
    flags += ("--min-size-to-sample", "1")
    proc = replay_process(*flags)
    rng = np.random.default_rng(0)
    with ReplayClient(proc.address) as client:
        client.insert(transitions(350), rng.uniform(0.1, 5, 350))
        client.insert(transitions(350, start=350), rng.uniform(0.1, 5, 350))  # FIFO evicts 200
        batch = client.sample(64, beta=0.4)
        client.update_priorities(batch.keys, rng.uniform(0.1, 5, 64))
        client.checkpoint()
        checkpointed, info = digest(client), client.info()
        client.insert(transitions(50, start=700))  # after the checkpoint: lost by the kill
        assert digest(client) != checkpointed
    proc.process.send_signal(signal.SIGKILL)
    proc.process.wait(10)
    restarted = replay_process(*flags)
    with ReplayClient(restarted.address) as client:
        assert digest(client) == checkpointed
        after = client.info()
        assert (after.inserts, after.samples, after.size) == (info.inserts, info.samples, info.size)
        # Keys continue where the checkpoint left off; stale keys stay stale.
        assert client.insert(transitions(1, start=700)).first_key == 700
        assert client.update_priorities(np.array([0, 699]), np.ones(2)).stale == 1


def test_periodic_checkpoints_keep_the_newest_two(replay_process, tmp_path):
    ckpt = tmp_path / "ckpt"
    proc = replay_process("--checkpoint-dir", str(ckpt), "--checkpoint-interval", "0.2")
    with ReplayClient(proc.address) as client:
        client.insert(transitions(10))
    wait_for(lambda: proc.log().count("checkpoint ") >= 3, 30, "three periodic checkpoints")
    assert len(checkpoints(ckpt)) == 2
    proc.stop()


def test_settings_from_file_env_and_flags(replay_process, tmp_path, monkeypatch):
    config = tmp_path / "apexrl.toml"
    config.write_text(
        'max_message_mb = 64\n[replay]\ncapacity = 321\nmin_size_to_sample = 1\nalpha = 0.25\ntable = "t"\n'
    )
    monkeypatch.setenv("APEXRL_ALPHA", "0.5")  # env beats the file
    proc = replay_process("--config", str(config), "--table", "flagged")  # flags beat env
    with ReplayClient(proc.address, table="flagged") as client:
        info = client.info()
    assert (info.capacity, info.alpha) == (321, 0.5)
    proc.stop()


def test_bad_setting_fails_fast_naming_it(tmp_path):
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "apexrl.cli", "replay", "--port", "0", "--alpha", "-1"],
        capture_output=True, text=True, timeout=60, env={**os.environ, "APEXRL_METRICS_PORT": "0"},
    )  # fmt: skip
    assert result.returncode != 0
    assert "alpha" in result.stderr


def test_a_bad_config_table_is_one_line_and_exit_2(tmp_path):
    """A table of the config file that can never work ([[authorization]] naming no known
    role) is a usage error naming it, as a bad flag is, not a traceback."""
    import subprocess
    import sys

    config = tmp_path / "apexrl.toml"
    config.write_text('[[authorization]]\nrole = "pirate"\nmethods = ["Insert"]\n')
    result = subprocess.run(
        [sys.executable, "-m", "apexrl.cli", "replay", "--port", "0", "--config", str(config)],
        capture_output=True, text=True, timeout=60, env={**os.environ, "APEXRL_METRICS_PORT": "0"},
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "apexrl replay: error: [[authorization]]: entry 0: unknown role 'pirate'"
        " (roles: replay, learner, relay, actor, evaluator, admin)"
    ]


def test_a_taken_port_is_refused_not_shared(replay_process):
    """gRPC's default SO_REUSEPORT would let a second replay bind a serving one's port and
    split its connections between two tables."""
    import subprocess
    import sys

    first = replay_process()
    port = first.address.rsplit(":", 1)[1]
    result = subprocess.run(
        [sys.executable, "-m", "apexrl.cli", "replay", "--host", "127.0.0.1", "--port", port],
        capture_output=True, text=True, timeout=60, env={**os.environ, "APEXRL_METRICS_PORT": "0"},
    )  # fmt: skip
    assert result.returncode != 0
    assert f"127.0.0.1:{port}" in result.stderr  # the address it could not bind
    first.stop()


def test_writer_resends_what_a_killed_replay_never_acknowledged(replay_process):
    """A replay killed under a writer: the batches it never acknowledged go again, on a new
    stream, to the replay restarted at the same address; none is lost, none doubled."""
    first = replay_process("--min-size-to-sample", "1")
    port = first.address.rsplit(":", 1)[1]
    rows = transitions(300)
    with ReplayClient(first.address, retry_seconds=60) as client:
        writer = client.writer(batch=50, window=8)
        for i in range(100):
            writer.append({k: v[i] for k, v in rows.items()}, 1.0)
        writer.flush()
        first.kill()  # SIGKILL: nothing checkpointed, every connection cut
        second = replay_process("--min-size-to-sample", "1", "--port", port)
        for i in range(100, 300):
            writer.append({k: v[i] for k, v in rows.items()}, 1.0)
        writer.flush()
        assert writer.landed == 300
        info = client.info()
        batch = client.sample(200)
        writer.close()
    assert (info.size, info.inserts) == (200, 200)  # the new replay: exactly the 200 after
    # In order, each once: key k of the new replay holds row 100 + k.
    np.testing.assert_array_equal(batch.columns["obs"], rows["obs"][100 + batch.keys])
    second.stop()
