"""The dashboards read mean episode returns as _sum / _count: the return histograms must keep
their _sum (prometheus_client drops it when a bucket bound is negative), also for the negative
returns of Pendulum or Acrobot."""

import prometheus_client
import pytest

from apexrl.actor.loop import ActorMetrics
from apexrl.evaluator.loop import EvaluatorMetrics


@pytest.mark.parametrize(
    "make, name",
    [
        (
            lambda r: ActorMetrics(r, "noise_scale", "help").episode_return,
            "apexrl_actor_episode_return",
        ),
        (lambda r: EvaluatorMetrics(r).returns, "apexrl_evaluation_return"),
    ],
)
def test_return_histograms_expose_their_sum(make, name):
    registry = prometheus_client.CollectorRegistry()
    histogram = make(registry)
    for value in (-250.0, 120.0):
        histogram.observe(value)
    text = prometheus_client.generate_latest(registry).decode()
    assert f"{name}_sum -130.0" in text.splitlines()
    assert f"{name}_count 2.0" in text.splitlines()
