"""Local mode's metrics.csv `actor_mean_return`: per row, the mean return of the actors' episodes
that ended since the previous row, from the actors' episode_return histograms as local mode
scrapes them (_sum and _count over /metrics); NaN when none ended. An actor whose count falls
has restarted: its counters began again at 0, so its new totals all ended since the last row."""

import math
from types import SimpleNamespace

import prometheus_client
import pytest

from apexrl.actor.loop import ActorMetrics
from apexrl.local.monitoring import FIELDS, collect, unsolved_line
from apexrl.local.supervision import Child


class Actor:
    """An actor's metrics endpoint on loopback; `restart` starts a fresh one (counters at 0)."""

    def __init__(self, name: str):
        self.servers: list = []
        self.child = Child(name, None, {}, None)
        self.restart()

    def restart(self) -> None:
        registry = prometheus_client.CollectorRegistry()
        self.metrics = ActorMetrics(registry, "epsilon", "help")
        server, _ = prometheus_client.start_http_server(0, "127.0.0.1", registry)
        self.servers.append(server)
        self.child.ports = {"metrics_port": server.server_port}

    def episodes(self, *returns: float) -> None:
        for value in returns:
            self.metrics.episode_return.observe(value)


@pytest.fixture
def actors():
    made = [Actor("actor-0"), Actor("actor-1")]
    yield made
    for actor in made:
        for server in actor.servers:
            server.shutdown()
            server.server_close()


def test_each_row_averages_the_episodes_ended_since_the_row_before(actors):
    first, second = actors
    run = SimpleNamespace(children=[a.child for a in actors], launched=0.0)
    rows: list[dict] = []

    def row() -> float:
        rows.append(collect(run, len(rows) + 1.0, rows[-1] if rows else None))
        return rows[-1]["actor_mean_return"]

    assert math.isnan(row())  # no episode yet
    first.episodes(10.0, 20.0)
    second.episodes(60.0)
    assert row() == 30.0  # (10 + 20 + 60) / 3
    assert math.isnan(row())  # none ended since
    first.episodes(-5.0)  # negative returns (Pendulum) count in _sum too
    second.episodes(65.0, 90.0)
    assert row() == 50.0  # (-5 + 65 + 90) / 3
    second.restart()  # 3 episodes before, its new process 1 since: all ended since the last row
    second.episodes(100.0)
    first.episodes(7.0)
    assert row() == 53.5  # (100 + 7) / 2
    second.episodes(40.0, 50.0)
    assert row() == 45.0  # from the restarted actor's new totals on
    assert set(rows[0]) == set(FIELDS)


def _row(seconds, round_score, best, version):
    return {
        "seconds": seconds,
        "env_steps": 1000 * seconds,
        "eval_mean_return": round_score,
        "eval_best_mean_return": best,
        "eval_best_version": version,
    }


def test_the_unsolved_line_gives_the_best_models_score_not_a_higher_round():
    # Pendulum: a 10-episode round scored -141.9, above the -200 target, and its 50 confirming
    # episodes pulled the mean under it; the best model holds -230.5.
    rows = [
        _row(1.0, math.nan, math.nan, 0),
        _row(2.0, -141.9, -230.5, 7),
        _row(3.0, -400.0, -230.5, 7),
    ]
    line = unsolved_line(rows, -200.0)
    assert line == (
        "not solved in 3.0 s (3,000 env steps): best model -230.5 < -200 (version 7);"
        " best evaluation round -141.9, not held by its confirming episodes"
    )
    rows[1]["eval_mean_return"] = -250.0  # no round above the best model's score
    assert unsolved_line(rows, -200.0).endswith("best model -230.5 < -200 (version 7)")


def test_the_unsolved_line_before_any_best_model():
    assert unsolved_line([_row(1.0, math.nan, math.nan, 0)], 475.0).endswith("no evaluation yet")
    line = unsolved_line([_row(1.0, 9.5, math.nan, 0)], 475.0)
    assert line.endswith(": no best model yet; best evaluation round 9.5")
