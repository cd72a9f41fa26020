"""The evaluator: plays each new parameter version greedily and reports the mean return.

It plays the newest version, at most one every `interval` seconds; with a `window` it plays
every version in order, as a single-process trainer that evaluates after each training round
does, from the recent versions the learner keeps (its history_mb). Slower than the learner,
it falls behind, but never more than `window` versions: those further back are skipped, as
are versions the learner no longer keeps, and counted.

A version whose evaluation beats the best score so far plays a second, longer round on fresh
seeds (confirm_episodes); scored by the mean over both rounds, it is sent with its parameters
to the learner, which keeps the best one as a checkpoint (learner/best.py). Every episode
runs on a seed of its own, counting up from the evaluator's seed.

With a cpu_share it watches cheaply: a round that took c CPU-seconds is followed by a pause
until c / cpu_share seconds have passed, so on cores shared with training it plays fewer
rounds, never shorter ones.
"""

import logging
import math
import os
import threading
import time

import grpc
import numpy as np
import prometheus_client

from apexrl import algorithms
from apexrl.algorithms.envs import RETURN_BUCKETS, EnvOptions
from apexrl.algorithms.evaluation import Stopped, evaluate
from apexrl.common.backoff import Backoff
from apexrl.common.learner_client import LearnerClient
from apexrl.config import EvaluatorConfig

log = logging.getLogger(__name__)

POLL_SECONDS = 1.0  # long poll for the next version (the learner answers when it publishes)


class EvaluatorMetrics:
    def __init__(self, registry: prometheus_client.CollectorRegistry):
        def metric(kind, name, doc, **kw):
            return kind(f"apexrl_evaluation_{name}", doc, registry=registry, **kw)

        C, G, H = prometheus_client.Counter, prometheus_client.Gauge, prometheus_client.Histogram
        self.mean_return = metric(G, "mean_return", "Mean return of the last evaluation.")
        self.returns = metric(
            H, "return", "Returns of evaluation episodes.", buckets=RETURN_BUCKETS
        )
        self.rounds = metric(C, "rounds", "Evaluations done.")
        self.version = metric(G, "parameter_version", "Parameter version of the last evaluation.")
        self.best_mean = metric(
            G,
            "best_mean_return",
            "Score of the best model the learner keeps (mean over both evaluation rounds).",
        )
        self.best_version = metric(G, "best_version", "Parameter version of the best model.")
        self.report_failures = metric(
            C, "report_failures", "Best-model candidates the learner could not keep (see the log)."
        )
        self.skipped = metric(
            C,
            "versions_skipped",
            "Versions never played: published between two evaluations, or (window) no"
            " longer kept by the learner when their turn came.",
        )
        self.behind = metric(
            G, "versions_behind", "Versions the learner had published after the one last played."
        )
        self.held_back = metric(
            C,
            "held_back_seconds",
            "Seconds waited beyond the interval to keep the evaluator within its cpu_share.",
        )


def run(
    config: EvaluatorConfig,
    registry: prometheus_client.CollectorRegistry,
    stop: threading.Event,
    metrics: EvaluatorMetrics | None = None,
) -> None:
    """metrics: registered by the caller before the ready file, so every scrape sees them."""
    check(config)
    os.nice(config.nice)
    m = metrics or EvaluatorMetrics(registry)
    builder = algorithms.make(config)
    policy = builder.policy()
    algorithms.set_torch_threads(config.threads)
    learner = LearnerClient(config.learner, retry_seconds=1.0, retry_cap=0.1, tls=config, stop=stop)
    version, lineage, backoff = 0, 0, Backoff(cap=2.0)
    newest = 0  # the learner's newest version at the last answer
    best = -math.inf  # the best score the learner keeps (from its answers)
    play = Games(policy, config, stop)
    videos = None
    if config.video_every:
        from apexrl.algorithms.video import BestVideos

        videos = BestVideos(policy, config)

    try:
        while not stop.is_set():
            started, cpu_started = time.monotonic(), time.process_time()
            try:
                params = learner.get_parameters(
                    max(version, newest - config.window) if config.window else version,
                    have_lineage=lineage,
                    wait_seconds=POLL_SECONDS,
                    in_order=config.window > 0,
                )
            except Exception as err:  # learner away: wait and retry
                log.info("evaluator: learner unavailable (%s)", err)
                stop.wait(backoff.next_delay())
                continue
            backoff.reset()
            if not params.arrays:  # nothing new within the long poll: ask again
                continue
            if params.algorithm != builder.name:
                raise ValueError(
                    f"algorithm: this evaluator runs {builder.name}, the learner at"
                    f" {config.learner} runs {params.algorithm}"
                )
            policy.load(params.arrays)
            if params.lineage == lineage:
                m.skipped.inc(params.version - version - 1)
            m.behind.set(params.newest_version - params.version)
            version, lineage, newest = params.version, params.lineage, params.newest_version
            round_seed = play.next_seed
            returns = play(config.episodes)
            report(m, params, returns)
            before, best = best, offer_best(learner, params, returns, best, play, config, m)
            if videos is not None and best > before:
                recorded = videos.new_best(version, round_seed)
                if recorded is not None:
                    log.info("video of version %d: %s", version, recorded)
            wall, cpu = time.monotonic() - started, time.process_time() - cpu_started
            pause = pause_seconds(config, wall, cpu)
            m.held_back.inc(max(0.0, pause - max(0.0, config.interval - wall)))
            stop.wait(pause)
    except Stopped:  # SIGTERM during a round: its episodes are abandoned, nothing reported
        pass
    finally:
        learner.close()


def check(config: EvaluatorConfig) -> None:
    """ValueError naming a setting the evaluator cannot run with."""
    if config.window < 0:
        raise ValueError(f"window: must be >= 0 (0: the newest version only), got {config.window}")
    if not 0 <= config.nice <= 19:
        raise ValueError(f"nice: must be 0 to 19, got {config.nice}")
    if not 0 <= config.cpu_share < math.inf:  # NaN fails too
        raise ValueError(f"cpu_share: must be >= 0 cores (0: no bound), got {config.cpu_share}")


def report(m: EvaluatorMetrics, params, returns: np.ndarray) -> None:
    """A round's returns to the metrics and the log."""
    for value in returns:
        m.returns.observe(value)
    m.mean_return.set(float(returns.mean()))
    m.version.set(params.version)
    m.rounds.inc()
    log.info(
        "evaluation of version %d (update %d): mean return %.1f over %d episodes",
        params.version,
        params.update_step,
        returns.mean(),
        len(returns),
    )


def pause_seconds(config: EvaluatorConfig, wall: float, cpu: float) -> float:
    """Seconds to wait after a round that took `wall` seconds and `cpu` CPU-seconds of this
    process: the rest of the interval, or longer where the round used more than cpu_share of a
    core. Round and pause then average at most cpu_share: fewer rounds, each as long as before,
    so what counts as solved does not change."""
    pause = config.interval - wall
    if config.cpu_share > 0:
        pause = max(pause, cpu / config.cpu_share - wall)
    return max(0.0, pause)


class Games:
    """Plays episodes of the policy, every episode on a seed of its own, counting up."""

    def __init__(self, policy, config: EvaluatorConfig, stop: threading.Event | None = None):
        self.policy, self.config, self.next_seed, self.stop = policy, config, config.seed, stop

    def __call__(self, episodes: int) -> np.ndarray:
        c = self.config
        returns = evaluate(
            self.policy, c.env, episodes, self.next_seed, c.epsilon, EnvOptions.of(c), self.stop
        )
        self.next_seed += episodes
        return returns


def offer_best(learner, params, returns: np.ndarray, best: float, play: Games, config, m) -> float:
    """A version that beats the best score so far plays a confirmation round (ten lucky
    episodes are not enough to keep it), and is offered to the learner with the mean over both
    rounds. Returns the best score the learner now keeps."""
    first_seed = play.next_seed - len(returns)
    if returns.mean() > best and config.confirm_episodes > 0:
        returns = np.concatenate([returns, play(config.confirm_episodes)])
        log.info(
            "confirmation of version %d: mean return %.1f over %d episodes",
            params.version,
            returns.mean(),
            len(returns),
        )
    if returns.mean() <= best:
        return best
    try:
        answer = learner.report_evaluation(
            params, returns, env=config.env, first_seed=first_seed, epsilon=config.epsilon
        )
    except grpc.RpcError as err:
        m.report_failures.inc()
        log.warning("best model candidate version %d not kept: %s", params.version, err)
        return returns.mean()  # only better ones are worth a second round now
    m.best_mean.set(answer.best_mean_return)
    m.best_version.set(answer.best_version)
    return answer.best_mean_return
