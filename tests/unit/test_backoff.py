"""retry_unavailable: retries a server's going away (UNAVAILABLE, or a CANCELLED the caller did
not cause) and nothing else, within retry_seconds, delays bounded by cap."""

import logging
import threading

import grpc
import pytest

from apexrl.common import backoff


class Failure(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode):
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return f"{self._code.name} for the test"


def failing(times: int, code=grpc.StatusCode.UNAVAILABLE):
    """A call that fails `times` times with `code`, then answers 'ok'."""
    calls = []

    def call():
        calls.append(1)
        if len(calls) <= times:
            raise Failure(code)
        return "ok"

    return call, calls


@pytest.fixture
def slept(monkeypatch) -> list[float]:
    """The delays retry_unavailable sleeps, on a fake clock that the sleeps advance."""
    delays: list[float] = []
    monkeypatch.setattr(backoff.time, "sleep", delays.append)
    monkeypatch.setattr(backoff.time, "monotonic", lambda: sum(delays))
    return delays


def test_delays_stay_under_the_cap_and_only_the_first_retry_logs_at_info(slept, caplog):
    call, calls = failing(12)
    with caplog.at_level(logging.DEBUG, logger=backoff.__name__):
        assert backoff.retry_unavailable(call, "learner get_parameters", None, cap=0.1) == "ok"
    assert len(calls) == 13 and len(slept) == 12
    assert max(slept) <= 0.1
    levels = [r.levelno for r in caplog.records]
    assert levels == [logging.INFO] + [logging.DEBUG] * 11
    assert "learner get_parameters: server unavailable" in caplog.records[0].getMessage()


def test_default_cap_lets_delays_grow_past_a_tenth_of_a_second(slept, monkeypatch):
    monkeypatch.setattr(backoff.random, "uniform", lambda low, high: high)  # the bound itself
    call, _ = failing(6)
    backoff.retry_unavailable(call, "replay sample", None)
    assert slept == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6, 3.2])


def test_other_codes_are_raised_at_once(slept):
    call, calls = failing(1, grpc.StatusCode.INVALID_ARGUMENT)
    with pytest.raises(Failure):
        backoff.retry_unavailable(call, "replay insert", None, cap=0.1)
    assert len(calls) == 1 and slept == []


def test_gives_up_when_the_next_delay_would_pass_retry_seconds(slept, monkeypatch):
    monkeypatch.setattr(backoff.random, "uniform", lambda low, high: high)
    call, calls = failing(100)
    with pytest.raises(Failure):
        backoff.retry_unavailable(call, "learner get_parameters", 0.35, cap=0.1)
    # tries at 0, 0.1, 0.2 and 0.3 s; one more 0.1 s delay would end past 0.35 s
    assert len(calls) == 4 and slept == pytest.approx([0.1, 0.1, 0.1])


def test_a_stopping_process_tries_once_and_does_not_wait(slept):
    """Once the process's stop is set, an UNAVAILABLE call is raised at once: no retry, no
    delay (a stopping actor does not wait for a replay that is away)."""
    call, calls = failing(3)
    stop = threading.Event()
    stop.set()
    with pytest.raises(Failure):
        backoff.retry_unavailable(call, "x", retry_seconds=None, stop=stop)
    assert len(calls) == 1 and slept == []


def test_a_stop_during_the_delay_ends_the_retries():
    """stop set while a retry waits: the wait ends and the last error is raised, long before
    the delay bound of an hour would have passed."""
    call, calls = failing(10)
    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    with pytest.raises(Failure):
        backoff.retry_unavailable(call, "x", retry_seconds=None, cap=3600.0, stop=stop)
    assert stop.is_set() and len(calls) < 10


def test_a_cancelled_call_is_retried_unless_the_caller_cancelled_it(slept):
    """CANCELLED with the caller running: the server's stop cancelled it, so it goes again;
    with the caller's stop set or its client closed, the cancel was its own: raised at once."""
    call, calls = failing(2, grpc.StatusCode.CANCELLED)
    assert backoff.retry_unavailable(call, "replay sample", None, cap=0.1) == "ok"
    assert len(calls) == 3 and len(slept) == 2
    stop = threading.Event()
    stop.set()
    for options in ({"stop": stop}, {"closed": lambda: True}):
        call, calls = failing(2, grpc.StatusCode.CANCELLED)
        with pytest.raises(Failure):
            backoff.retry_unavailable(call, "replay sample", None, cap=0.1, **options)
        assert len(calls) == 1 and len(slept) == 2
