import numpy as np
import pytest

from apexrl.algorithms.exploration import epsilon_ladder


def test_ends_of_the_ladder():
    assert epsilon_ladder(0, 8) == pytest.approx(0.4)
    assert epsilon_ladder(7, 8) == pytest.approx(0.4**8)
    assert epsilon_ladder(0, 1) == 0.4


def test_middle_and_custom_parameters():
    assert epsilon_ladder(1, 3) == pytest.approx(0.4**4.5)
    assert epsilon_ladder(1, 2, base=0.5, alpha=1.0) == pytest.approx(0.25)


def test_monotone_decreasing():
    eps = np.array([epsilon_ladder(i, 360) for i in range(360)])
    assert np.all(np.diff(eps) < 0)
    assert np.all((eps > 0) & (eps <= 0.4))


@pytest.mark.parametrize(
    "i, n, name", [(-1, 4, r"i \(actor"), (4, 4, r"i \(actor"), (0, 0, r"n \(number")]
)
def test_rejects_bad_index(i, n, name):
    with pytest.raises(ValueError, match=name):
        epsilon_ladder(i, n)
