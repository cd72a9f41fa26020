"""The evaluator (in a thread) against a real learner server over loopback: which versions it
plays, in order or not, and what it counts as skipped."""

import contextlib
import math
import threading
import time
from collections.abc import Iterator

import grpc
import numpy as np
import prometheus_client
import pytest

from apexrl import algorithms
from apexrl.algorithms.networks import state_to_numpy
from apexrl.common.learner_client import LearnerClient
from apexrl.common.parameters import ParameterStore
from apexrl.config import EvaluatorConfig, LearnerConfig
from apexrl.evaluator import loop as evaluator
from tests.conftest import serve_learner, wait_for

ENV = "CartPole-v1"


@contextlib.contextmanager
def evaluating(settings: EvaluatorConfig) -> Iterator[prometheus_client.CollectorRegistry]:
    """The evaluator running in a thread, and its metrics; stopped on leaving."""
    registry, stop = prometheus_client.CollectorRegistry(), threading.Event()
    metrics = evaluator.EvaluatorMetrics(registry)
    thread = threading.Thread(target=evaluator.run, args=(settings, registry, stop, metrics))
    thread.start()
    try:
        yield registry
    finally:
        stop.set()
        thread.join(10)


def marked(arrays: dict, version: int) -> dict:
    """The parameters with `version` written into every logit bias: the greedy policy is the
    same, and the weights a policy holds tell which version it is."""
    bias = next(name for name in arrays if name.startswith("logits") and name.endswith("bias"))
    return arrays | {bias: np.full_like(arrays[bias], version)}


@pytest.mark.parametrize(("kept_versions", "window"), [(40, 100), (0, 100), (40, 3)])
def test_a_window_plays_each_version_in_order_while_the_learner_keeps_it(
    tmp_path, monkeypatch, kept_versions, window
):
    """30 versions published in a burst while the evaluator plays: the versions whose weights
    it actually played, read from its policy at each round, only ever increase and end on the
    newest; with every version kept and a window wider than the burst they are all 30, one
    after the other; with none kept besides the newest, or a narrow window, the ones not
    played are the ones it counts as skipped."""
    config = LearnerConfig(algorithm="ppo", env=ENV, checkpoint_dir=str(tmp_path / "ckpt"))
    arrays = state_to_numpy(algorithms.make(config).network())
    size = sum(a.nbytes for a in arrays.values())
    store = ParameterStore(history_bytes=kept_versions * size)
    store.publish(marked(arrays, 1), update_step=0)
    played: list[int] = []
    games = evaluator.Games.__call__

    def recording(self, episodes):
        played.append(int(self.policy.arrays["logits.bias"][0]))
        return games(self, episodes)

    monkeypatch.setattr(evaluator.Games, "__call__", recording)
    with serve_learner(tmp_path, store, arrays, config) as (address, _):
        settings = EvaluatorConfig(
            algorithm="ppo", env=ENV, learner=address, episodes=2, confirm_episodes=0,
            interval=0.0, window=window,
        )  # fmt: skip
        with evaluating(settings) as registry:
            wait_for(lambda: played, 20, "the first evaluation")
            for step in range(1, 30):
                store.publish(marked(arrays, step + 1), update_step=step)
            wait_for(lambda: played[-1] == 30, 60, "version 30 played")
    assert played[0] == 1 and played[-1] == 30
    assert all(np.diff(played) > 0), played
    if window > 30 and kept_versions > 30:
        assert played == list(range(1, 31))
    assert len(played) + registry.get_sample_value("apexrl_evaluation_versions_skipped_total") == 30


@pytest.mark.parametrize(
    ("name", "bad"),
    [("window", -1), ("nice", -1), ("nice", 20), ("cpu_share", -0.1), ("cpu_share", math.nan)],
)
def test_bad_settings_are_refused_naming_them(name, bad):
    settings = EvaluatorConfig(algorithm="ppo", env=ENV, learner="127.0.0.1:1", **{name: bad})
    with pytest.raises(ValueError, match=name):
        evaluator.run(settings, prometheus_client.CollectorRegistry(), threading.Event())


def test_a_long_poll_is_cancelled_when_the_process_stops(tmp_path):
    """An actor's or evaluator's long poll for a version newer than the newest is cancelled
    once the process's stop is set, instead of being waited out (30 s here)."""
    config = LearnerConfig(algorithm="ppo", env=ENV, checkpoint_dir=str(tmp_path / "ckpt"))
    arrays = state_to_numpy(algorithms.make(config).network())
    store = ParameterStore(history_bytes=0)
    version = store.publish(arrays, update_step=0)
    stop = threading.Event()
    with serve_learner(tmp_path, store, arrays, config) as (address, _):
        client = LearnerClient(address, retry_seconds=1.0, stop=stop)
        try:
            assert client.get_parameters().version == version  # answered while not stopping
            threading.Timer(0.3, stop.set).start()
            with pytest.raises(grpc.FutureCancelledError):
                client.get_parameters(version, have_lineage=store.lineage, wait_seconds=30.0)
        finally:
            client.close()


def busy(seconds: float) -> None:
    """Uses `seconds` of this thread's CPU."""
    until = time.thread_time() + seconds
    while time.thread_time() < until:
        pass


@pytest.mark.parametrize("cpu_share", [0.0, 0.25])
def test_a_cpu_share_spaces_the_rounds_by_their_cpu_time(tmp_path, monkeypatch, cpu_share):
    """Rounds that each burn 0.1 CPU-seconds, a new version always waiting: with no bound they
    follow one another at once; held to a quarter of a core, each next round starts at least
    0.1 / 0.25 = 0.4 s after the last one began, and the wait is counted."""
    config = LearnerConfig(algorithm="ppo", env=ENV, checkpoint_dir=str(tmp_path / "ckpt"))
    arrays = state_to_numpy(algorithms.make(config).network())
    store = ParameterStore(history_bytes=0)
    store.publish(arrays, update_step=0)
    starts: list[float] = []
    walls: list[float] = []  # each round's play, in wall seconds (more than 0.1 on a busy CPU)

    def burning(self, episodes):
        starts.append(time.monotonic())
        store.publish(arrays, update_step=len(starts))  # the next round finds a new version
        busy(0.1)
        walls.append(time.monotonic() - starts[-1])
        self.next_seed += episodes
        return np.zeros(episodes)

    monkeypatch.setattr(evaluator.Games, "__call__", burning)
    with serve_learner(tmp_path, store, arrays, config) as (address, _):
        settings = EvaluatorConfig(
            algorithm="ppo", env=ENV, learner=address, episodes=2, confirm_episodes=0,
            interval=0.0, cpu_share=cpu_share,
        )  # fmt: skip
        with evaluating(settings) as registry:
            wait_for(lambda: len(starts) >= 5, 30, "5 rounds")
    gaps = np.diff(starts[:5])
    held = registry.get_sample_value("apexrl_evaluation_held_back_seconds_total")
    if cpu_share:
        assert gaps.min() >= 0.1 / cpu_share * 0.95, gaps
        # Each pause: 0.4 s from its round's start, less the round (its play, and a few ms).
        assert held >= sum(max(0.0, 0.4 - wall - 0.05) for wall in walls[:4]), (held, walls)
    else:
        assert gaps.max() < 0.3, gaps
        assert held == 0


@pytest.mark.parametrize(
    ("interval", "cpu_share", "wall", "cpu", "pause"),
    [
        (1.0, 0.0, 0.25, 0.2, 0.75),  # the interval's rest
        (1.0, 0.1, 0.25, 0.2, 1.75),  # 0.2 CPU-seconds at 0.1 of a core: 2 s from the start
        (5.0, 0.1, 0.25, 0.2, 4.75),  # the interval is the longer wait
        (0.0, 0.5, 3.0, 1.0, 0.0),  # a round slower than its share needs no pause
    ],
)
def test_the_pause_after_a_round(interval, cpu_share, wall, cpu, pause):
    settings = EvaluatorConfig(env=ENV, interval=interval, cpu_share=cpu_share)
    assert evaluator.pause_seconds(settings, wall, cpu) == pytest.approx(pause)
