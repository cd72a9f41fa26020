"""Both replay clients offer what the services use of a replay (client.Replay): every method
of the protocol, taking its parameters under the same names, in the same order, with the same
defaults (a client may take more, after them, each with a default)."""

import inspect

import pytest

from apexrl.replay.client import Replay, ReplayClient
from apexrl.replay.sharded import ShardedReplayClient

METHODS = sorted(
    name
    for name, value in vars(Replay).items()
    if inspect.isfunction(value) and not name.startswith("_")
)


def parameters(function) -> list[inspect.Parameter]:
    return list(inspect.signature(function).parameters.values())


def test_the_protocol_has_the_verbs_the_services_call():
    assert {"insert", "sample", "sample_stream", "update_priorities", "info", "close"} <= set(
        METHODS
    )


@pytest.mark.parametrize("client", [ReplayClient, ShardedReplayClient], ids=lambda c: c.__name__)
@pytest.mark.parametrize("method", METHODS)
def test_each_client_takes_the_protocols_parameters(client, method):
    wanted = parameters(getattr(Replay, method))
    offered = parameters(getattr(client, method))
    assert [(p.name, p.default) for p in offered[: len(wanted)]] == [
        (p.name, p.default) for p in wanted
    ]
    assert all(p.default is not inspect.Parameter.empty for p in offered[len(wanted) :])
