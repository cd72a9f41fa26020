"""The rate limiters' settings as they are stored and refused, and the queue's deadlock error
word for word (the side it names and the bound it quotes)."""

import math

import numpy as np
import pytest

from apexrl.common.errors import FailedPrecondition
from apexrl.replay.rate_limiters import QueueLimiter, RateLimiter


def test_settings_are_stored_as_plain_int_and_floats():
    """numpy scalars (a config read through numpy, a checkpoint's values) become the plain
    types to_json writes and the table compares."""
    limiter = RateLimiter(np.int64(3), np.float32(2.0), np.int32(4))
    assert type(limiter.min_size_to_sample) is int and limiter.min_size_to_sample == 3
    assert type(limiter.samples_per_insert) is float and limiter.samples_per_insert == 2.0
    assert type(limiter.error_buffer) is float and limiter.error_buffer == 4.0
    assert limiter.to_json() == {
        "min_size_to_sample": 3,
        "samples_per_insert": 2.0,
        "error_buffer": 4.0,
    }


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"min_size_to_sample": True}, "min_size_to_sample must be an integer >= 1, got True"),
        ({"min_size_to_sample": 2.5}, "min_size_to_sample must be an integer >= 1, got 2.5"),
        ({"error_buffer": math.nan}, "error_buffer must be finite and >= 0, got nan"),
        ({"error_buffer": math.inf}, "error_buffer must be finite and >= 0, got inf"),
        ({"error_buffer": "1"}, "error_buffer must be finite and >= 0, got '1'"),
        (
            {"samples_per_insert": 1.0, "error_buffer": 0.0},
            "error_buffer must be > 0 when samples_per_insert > 0, got 0.0 (a zero-width window"
            " would let neither side move)",
        ),
    ],
)
def test_bad_settings_are_refused_word_for_word(settings, message):
    with pytest.raises(ValueError) as caught:
        RateLimiter(**settings)
    assert str(caught.value) == message


def test_a_queue_insert_that_could_deadlock_names_the_sample_batches():
    with pytest.raises(FailedPrecondition) as caught:
        QueueLimiter().check_batches("q", 10, "batch", 7, 5)
    assert caught.value.field == "batch"
    assert str(caught.value) == (
        "batch: table 'q' is a queue of capacity 10: 7 items with the sample batches of 5"
        " requested before could wait for each other forever (an insert batch plus a sample"
        " batch must be <= capacity + 1 = 11)"
    )


def test_a_queue_sample_that_could_deadlock_names_the_insert_batches():
    with pytest.raises(FailedPrecondition) as caught:
        QueueLimiter().check_batches("q", 4, "batch_size", 3, 3)
    assert caught.value.field == "batch_size"
    assert "3 items with the insert batches of 3" in str(caught.value)
    assert str(caught.value).endswith("<= capacity + 1 = 5)")
    QueueLimiter().check_batches("q", 4, "batch_size", 3, 2)  # 3 + 2 = capacity + 1: fine
