"""Learner, actor and evaluator as real processes over loopback."""

import queue
import random
import threading
import time

import grpc
import numpy as np
import pytest

from apexrl.algorithms.exploration import epsilon_ladder
from apexrl.common import checkpoint
from apexrl.common.learner_client import LearnerClient
from apexrl.config import LearnerConfig
from apexrl.replay.client import ReplayClient
from tests.conftest import metric, wait_for


def test_parameters_versions_and_leases(service_process):
    replay = service_process("replay", "--min-size-to-sample", "1")
    learner = service_process("learner", "--replay", replay.address, "--lease-seconds", "1")
    with LearnerClient(learner.address, timeout=10) as client:
        first = client.get_parameters(0, "actor-a")
        assert first.version >= 1 and first.arrays
        assert all(a.dtype == np.float32 for a in first.arrays.values())
        assert (first.actor_index, first.num_actors, first.exploration) == (
            0,
            1,
            pytest.approx(0.4),
        )
        current = client.get_parameters(first.version, "actor-b", first.lineage)
        assert current.arrays == {} and current.version == first.version
        assert (current.actor_index, current.num_actors) == (1, 2)
        assert current.exploration == pytest.approx(0.4**8)
        with pytest.raises(grpc.RpcError) as caught:
            client.get_parameters(actor_id="x" * 129)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "actor_id" in caught.value.details()
        # A caller ahead of the learner (it restarted from an older checkpoint) is moved back.
        ahead = client.get_parameters(have_version=first.version + 1000)
        assert ahead.arrays and ahead.version < first.version + 1000
        # actor-a stops renewing: within a lease period the ladder re-spreads over actor-b alone.
        alone = wait_for(
            lambda: (p := client.get_parameters(0, "actor-b")).num_actors == 1 and p,
            10,
            "lease expiry",
        )
        assert (alone.actor_index, alone.exploration) == (0, pytest.approx(0.4))
    learner.stop()
    replay.stop()


def test_sigterm_answers_a_waiting_long_poll(service_process):
    """A stopping learner answers the long polls waiting on it instead of holding its shutdown
    for their whole wait: the poll gets the version it holds, and the learner exits 0."""
    replay = service_process("replay")  # empty: the learner publishes its first version only
    learner = service_process("learner", "--replay", replay.address, "--grace-seconds", "30")
    with (
        LearnerClient(learner.address, timeout=10) as poller,
        LearnerClient(learner.address) as other,
    ):
        first = poller.get_parameters(0, "poller")
        answers = {}
        poll = threading.Thread(
            target=lambda: answers.update(
                held=poller.get_parameters(first.version, "poller", first.lineage, 50.0)
            )
        )
        poll.start()
        # The poll renews its lease as it arrives: two actors mean it is waiting now.
        wait_for(lambda: other.get_parameters(0, "probe").num_actors == 2, 10, "the long poll")
        assert poll.is_alive()
        learner.stop()
        poll.join(20)  # far below the 50 s it asked to wait
        assert not poll.is_alive()
        assert answers["held"].version == first.version and not answers["held"].arrays
    replay.stop()


def queue_learner(replay_factory, config: LearnerConfig):
    """An in-process Learner for `config` (impala or ppo) and a replay holding a queue of its
    unrolls (capacity 64): (learner, replay server, unroll columns, metrics registry)."""
    import prometheus_client

    from apexrl import algorithms
    from apexrl.common.parameters import ParameterStore
    from apexrl.learner.metrics import LearnerMetrics
    from apexrl.learner.training import Learner

    columns = algorithms.transition_columns(config)
    server = replay_factory(
        capacity=64, sampler="fifo", remover="none", max_times_sampled=1, rate_limiter="queue",
        signature=",".join(c.spec() for c in columns),
    )  # fmt: skip
    registry = prometheus_client.CollectorRegistry()
    learner = Learner(config, algorithms.make(config), LearnerMetrics(registry), ParameterStore())
    return learner, server, columns, registry


def test_an_on_policy_learner_takes_only_the_batches_it_can_hold(replay_factory):
    """Sampled unrolls leave a queue table, so the learner must not sample ahead of its
    prefetch queue: with the queue full and nothing trained, exactly the batches it holds (and
    the one waiting to go in) have left the table, and stopping it loses nothing else. (A
    server stream kept sampling into gRPC's buffers: a slow Atari learner emptied the queue
    that way, 544 unrolls sampled for 48 trained.)"""
    config = LearnerConfig(algorithm="impala", env="CartPole-v1", batch_size=8, prefetch=2)
    learner, server, columns, _ = queue_learner(replay_factory, config)
    unroll = {c.name: np.zeros((1, *c.shape), c.dtype) for c in columns}
    batches: queue.Queue = queue.Queue(maxsize=config.prefetch)
    with ReplayClient(server.address, timeout=10) as writer, ReplayClient(server.address) as replay:
        for _ in range(64):
            writer.insert(unroll)
        prefetch = threading.Thread(target=learner._prefetch, args=(replay, batches))
        prefetch.start()
        # 2 batches queued and a third waiting to go in: 24 unrolls have left the table.
        wait_for(lambda: batches.full() and writer.info().samples >= 24, 10, "a full queue")
        learner.stop.set()
        replay.close()
        prefetch.join(10)
        info = writer.info()
    assert (info.samples, info.size) == (24, 40)
    assert [len(batches.get_nowait()[2]) for _ in range(2)] == [8, 8]


def test_ppo_asks_for_exactly_the_unrolls_its_batch_lacks(replay_factory):
    """ppo drops unrolls of older versions and gathers current ones until it has batch_size.
    With 4 old unrolls ahead of 4 current ones (an actor that acted twice on a version), a
    sample of a whole batch takes 4 + 4, and another whole batch would wait for 4 more unrolls
    that no actor writes before the next version (the learner stalled each version until the
    actors' 1 s VERSION_WAIT ran out). Asking for the 4 it lacks trains at once."""
    config = LearnerConfig(algorithm="ppo", env="CartPole-v1", batch_size=8, max_updates=1)
    learner, server, columns, registry = queue_learner(replay_factory, config)
    current = learner.store.version

    def unrolls(n: int, version: int) -> dict[str, np.ndarray]:
        batch = {c.name: np.zeros((n, *c.shape), c.dtype) for c in columns}
        batch["version"][:] = version
        batch["discounts"][:] = 0.99
        return batch

    with ReplayClient(server.address, timeout=10) as writer, ReplayClient(server.address) as replay:
        writer.insert(unrolls(4, version=current - 1))
        writer.insert(unrolls(8, version=current))
        trainer = threading.Thread(target=learner.train, args=(replay,), daemon=True)
        trainer.start()
        trainer.join(15)
        stuck = trainer.is_alive()
        learner.stop.set()
        replay.close()
        trainer.join(10)
        info = writer.info()
    assert not stuck, "ppo waited for unrolls its batch did not need"
    assert learner.update_step == 1 and learner.samples_consumed == 8
    assert (info.samples, info.size) == (12, 0)
    assert registry.get_sample_value("apexrl_learner_stale_items_dropped_total") == 4


@pytest.mark.parametrize("algorithm", ["ppo", "impala"])
def test_an_on_policy_learner_stopped_while_its_sample_waits_ends_every_thread(
    replay_factory, algorithm
):
    """An empty queue holds the learner's sample; stopping it (stop, then the replay client
    closed, as the service's shutdown does) cancels the sample, and the training thread and
    every helper (the priority writer among them) end: nothing waits for a batch that cannot
    come. (The priority writer of a learner whose sample was cancelled used to wait for its
    end-of-work marker forever, holding the learner's exit for its whole grace.)"""
    config = LearnerConfig(algorithm=algorithm, env="CartPole-v1", batch_size=8)
    learner, server, _, _ = queue_learner(replay_factory, config)
    replay = ReplayClient(server.address, timeout=30)
    trainer = threading.Thread(target=train_quietly, args=(learner, replay), daemon=True)
    trainer.start()
    wait_for(lambda: learner.helpers and all(h.is_alive() for h in learner.helpers), 10,
             "training under way")  # fmt: skip
    learner.stop.set()
    replay.close()
    trainer.join(5)
    for thread in (trainer, *learner.helpers):
        thread.join(5)
        assert not thread.is_alive(), thread.name


def train_quietly(learner, replay) -> None:
    """Learner.train as the service's thread runs it: an error after stop is the stop."""
    try:
        learner.train(replay)
    except Exception:
        if not learner.stop.is_set():
            raise


def test_impala_publishes_every_publish_interval_updates(replay_factory):
    """impala's actors take the newest version when they pull, so it publishes like dqn, every
    publish_interval updates (ppo publishes every update: its actors wait for each version)."""
    config = LearnerConfig(
        algorithm="impala", env="CartPole-v1", batch_size=8, max_updates=6, publish_interval=3
    )
    learner, server, columns, _ = queue_learner(replay_factory, config)
    first = learner.store.version
    unrolls = {c.name: np.zeros((48, *c.shape), c.dtype) for c in columns}
    with ReplayClient(server.address, timeout=10) as writer, ReplayClient(server.address) as replay:
        writer.insert(unrolls)
        trainer = threading.Thread(target=learner.train, args=(replay,), daemon=True)
        trainer.start()
        wait_for(lambda: learner.update_step == 6, 30, "6 updates")
        learner.stop.set()
        replay.close()
        trainer.join(10)
    assert learner.store.version == first + 2  # after updates 3 and 6
    assert learner.store.update_step == 6


def test_learner_trains_checkpoints_on_sigterm_and_resumes_exactly(
    service_process, filled_replay, tmp_path
):
    ckpt = tmp_path / "learner"
    replay = filled_replay
    flags = ("--replay", replay.address, "--checkpoint-dir", str(ckpt), "--max-updates", "60",
             "--publish-interval", "10", "--batch-size", "32", "--seed", "3")  # fmt: skip
    learner = service_process("learner", *flags)
    with LearnerClient(learner.address) as client:
        wait_for(lambda: client.get_parameters().update_step >= 60, 60, "60 updates")
        trained = client.get_parameters()
    with ReplayClient(replay.address) as client:
        info = client.info()
    assert info.samples >= 60 * 32  # it trained on replay's batches
    assert wait_for(
        lambda: info.priority_updates > 0 or client.info().priority_updates, 10, "priorities"
    )
    learner.stop()
    path, meta, arrays = checkpoint.load_newest(ckpt, "learner")
    assert meta["update_step"] == 60 and meta["version"] >= trained.version

    resumed = service_process("learner", *flags)
    assert "resumed from" in resumed.log()
    with LearnerClient(resumed.address) as client:
        after = client.get_parameters()
    assert (after.update_step, after.version) == (60, meta["version"])  # never backwards
    for name, value in after.arrays.items():
        np.testing.assert_array_equal(value, arrays[f"online/{name}"])
    resumed.stop()
    replay.stop()


def test_actor_keeps_running_through_a_replay_outage(service_process):
    replay = service_process("replay", "--min-size-to-sample", "1")
    port = replay.address.rsplit(":", 1)[1]
    learner = service_process("learner", "--replay", replay.address, "--batch-size", "32")
    actor = service_process("actor", "--replay", replay.address, "--learner", learner.address,
                            "--num-envs", "2", "--insert-batch", "16", "--buffer-limit", "300")  # fmt: skip
    with ReplayClient(replay.address) as client:
        wait_for(lambda: client.info().inserts > 0, 60, "first inserts")
    replay.kill()  # SIGKILL: no goodbye
    wait_for(lambda: metric(actor.metrics_port, "apexrl_actor_transitions_dropped_total") > 0, 60,
             "actor to fill its bounded buffer and drop")  # fmt: skip
    steps = metric(actor.metrics_port, "apexrl_actor_env_steps_total")
    wait_for(
        lambda: metric(actor.metrics_port, "apexrl_actor_env_steps_total") > steps, 30, "acting on"
    )
    assert actor.process.poll() is None and learner.process.poll() is None
    back = service_process("replay", "--min-size-to-sample", "1", "--port", port)
    with ReplayClient(back.address) as client:
        wait_for(lambda: client.info().inserts > 0, 60, "inserts after the outage")
    assert metric(actor.metrics_port, "apexrl_actor_transitions_buffered") <= 300 + 16
    for proc in (actor, learner, back):
        proc.stop()


def test_learner_killed_resumes_from_its_last_checkpoint(service_process, filled_replay, tmp_path):
    ckpt = tmp_path / "learner"
    replay = filled_replay
    flags = ("--replay", replay.address, "--checkpoint-dir", str(ckpt), "--checkpoint-interval", "0.5",
             "--batch-size", "32", "--publish-interval", "5")  # fmt: skip
    learner = service_process("learner", *flags)
    actor = service_process("actor", "--replay", replay.address, "--learner", learner.address,
                            "--num-envs", "2", "--insert-batch", "16", "--pull-interval", "50")  # fmt: skip
    wait_for(lambda: len(checkpoint.checkpoints(ckpt, "learner")) >= 2, 60, "periodic checkpoints")
    wait_for(
        lambda: metric(actor.metrics_port, "apexrl_actor_parameter_version") > 0, 60, "weights"
    )
    with LearnerClient(learner.address) as client:
        live = client.get_parameters()  # what an actor holds: newer than any checkpoint
    learner.kill()  # SIGKILL: no final checkpoint
    # Meanwhile the actor acts on the weights it holds and keeps inserting.
    steps = metric(actor.metrics_port, "apexrl_actor_env_steps_total")
    with ReplayClient(replay.address) as client:
        inserts = client.info().inserts
        wait_for(lambda: client.info().inserts > inserts + 100, 60, "inserts without a learner")
    assert metric(actor.metrics_port, "apexrl_actor_env_steps_total") > steps
    _, meta, arrays = checkpoint.load_newest(ckpt, "learner")
    assert meta["version"] <= live.version
    resumed = service_process("learner", *flags, "--max-updates", str(meta["update_step"]),
                              "--port", learner.address.rsplit(":", 1)[1])  # fmt: skip
    with LearnerClient(resumed.address) as client:
        back = client.get_parameters(have_version=live.version, have_lineage=live.lineage)
        # Same number as the checkpoint's, but held from the killed process: sent again.
        same_number = client.get_parameters(meta["version"], have_lineage=live.lineage)
        current = client.get_parameters(back.version, have_lineage=back.lineage)
    assert (back.update_step, back.version) == (meta["update_step"], meta["version"])
    assert back.lineage != live.lineage and same_number.arrays and not current.arrays
    for name, value in back.arrays.items():
        np.testing.assert_array_equal(value, arrays[f"online/{name}"])
    # The actor reconnects on its own and takes the resumed learner's weights.
    wait_for(
        lambda: metric(actor.metrics_port, "apexrl_actor_parameter_version") == meta["version"],
        60,
        "the actor on the resumed weights",
    )
    actor.stop()
    resumed.stop()
    replay.stop()


def test_random_actor_kills_leave_the_others_running_and_respread_the_ladder(service_process):
    replay = service_process("replay", "--min-size-to-sample", "64")
    learner = service_process("learner", "--replay", replay.address, "--lease-seconds", "2",
                              "--batch-size", "32")  # fmt: skip
    flags = ("--replay", replay.address, "--learner", learner.address, "--num-envs", "1",
             "--pull-interval", "50", "--insert-batch", "16")  # fmt: skip
    actors = [service_process("actor", *flags) for _ in range(4)]

    def epsilons(group) -> list[float]:
        return sorted(metric(a.metrics_port, "apexrl_actor_epsilon") for a in group)

    def places(group) -> list[float]:
        return sorted(metric(a.metrics_port, "apexrl_actor_ladder_index") for a in group)

    def ladder(n: int):
        return pytest.approx(sorted(epsilon_ladder(i, n) for i in range(n)))

    wait_for(lambda: places(actors) == [0, 1, 2, 3] and epsilons(actors) == ladder(4), 60,
             "the ladder over 4 actors")  # fmt: skip
    seed = random.randrange(2**32)
    doomed = random.Random(seed).sample(actors, 2)
    survivors = [a for a in actors if a not in doomed]
    steps = {id(a): metric(a.metrics_port, "apexrl_actor_env_steps_total") for a in survivors}
    failures = {id(a): metric(a.metrics_port, "apexrl_actor_parameter_pull_failures_total")
                for a in survivors}  # fmt: skip
    killed = time.monotonic()
    for actor in doomed:
        actor.kill()  # SIGKILL: no goodbye, the lease just stops being renewed
    # Places, not only epsilons: survivors at places 0 and 3 of 4 already hold 0.4 and 0.4^8.
    wait_for(lambda: places(survivors) == [0, 1] and epsilons(survivors) == ladder(2), 30,
             f"re-spread (seed {seed})")  # fmt: skip
    print(f"ladder re-spread over 2 survivors {time.monotonic() - killed:.1f} s after the kills")
    assert metric(learner.metrics_port, "apexrl_learner_live_actors") == 2
    with ReplayClient(replay.address) as client:
        inserts = client.info().inserts
        wait_for(lambda: client.info().inserts > inserts, 30, "survivors inserting")
    for actor in survivors:
        assert actor.process.poll() is None
        assert metric(actor.metrics_port, "apexrl_actor_env_steps_total") > steps[id(actor)]
        assert (
            metric(actor.metrics_port, "apexrl_actor_parameter_pull_failures_total")
            == (failures[id(actor)])
        )
    for proc in (*survivors, learner, replay):
        proc.stop()


def test_replay_killed_mid_training_restores_its_checkpoint_and_training_goes_on(
    service_process, tmp_path
):
    from apexrl.replay import checkpoint as replay_checkpoint

    ckpt = tmp_path / "replay"
    flags = ("--min-size-to-sample", "64", "--checkpoint-dir", str(ckpt),
             "--checkpoint-interval", "1")  # fmt: skip
    replay = service_process("replay", *flags)
    learner = service_process("learner", "--replay", replay.address, "--batch-size", "32")
    actor = service_process("actor", "--replay", replay.address, "--learner", learner.address,
                            "--num-envs", "2", "--insert-batch", "16")  # fmt: skip
    with LearnerClient(learner.address) as learner_client:
        wait_for(lambda: learner_client.get_parameters().update_step >= 20, 90, "training")
        wait_for(lambda: (found := replay_checkpoint.load_newest(ckpt)) and found[1][0].inserts,
                 30, "a replay checkpoint holding transitions")  # fmt: skip
        with ReplayClient(replay.address) as client:
            acknowledged = client.info().inserts  # the kill comes right after: a lower bound
        replay.kill()
        path, (state,) = replay_checkpoint.load_newest(ckpt)
        lost = acknowledged - state.inserts
        print(f"replay kill -9: {lost} acknowledged transitions after its last checkpoint lost "
              f"(checkpoint every 1 s; {acknowledged} acknowledged in all)")  # fmt: skip
        assert 0 <= lost < acknowledged
        step = learner_client.get_parameters().update_step
        back = service_process("replay", *flags, "--port", replay.address.rsplit(":", 1)[1])
        assert (
            f"restored table 'default' from {path}: {state.size} items, {state.inserts} inserts"
            in back.log()
        )
        with ReplayClient(back.address) as client:  # actors and learner reconnect on their own
            wait_for(lambda: client.info().inserts > state.inserts, 60, "inserts after restart")
            wait_for(lambda: learner_client.get_parameters().update_step > step + 10, 60,
                     "training on the restored replay")  # fmt: skip
            assert client.info().samples > state.samples
    for proc in (actor, learner, back):
        proc.stop()


def test_an_actor_decays_its_epsilon_over_its_env_steps(service_process):
    """[actor] exploration as a schedule: the actor's epsilon goes from 1 to 0 over its first
    800 env steps, whatever the learner's ladder holds for it (0.4, alone)."""
    replay = service_process("replay", "--min-size-to-sample", "64")
    learner = service_process("learner", "--replay", replay.address, "--batch-size", "32")
    actor = service_process(
        "actor", "--replay", replay.address, "--learner", learner.address, "--num-envs", "2",
        "--pull-interval", "50", "--exploration", '{ linear = [1.0, 0.0], over = "800 env steps" }',
    )  # fmt: skip
    seen = []

    def decayed() -> bool:
        seen.append(metric(actor.metrics_port, "apexrl_actor_epsilon"))
        return metric(actor.metrics_port, "apexrl_actor_env_steps_total") >= 900 and seen[-1] == 0

    wait_for(decayed, 60, "epsilon at 0 after 800 env steps")
    assert max(seen) > 0.5 and 0.4 not in seen  # it started high, never the ladder's 0.4
    for process in (actor, learner, replay):
        process.stop()
