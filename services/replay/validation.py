"""Type checks of settings and request values that arrive as any Python object.

They take `object`: narrowed from a declared int or float, mypy would read numbers.Integral
or numbers.Real as never matching and the code after the check as unreachable.
"""

import numbers


def is_int(x: object) -> bool:
    """An integer (numpy's included), not a bool."""
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def is_real(x: object) -> bool:
    """A real number (numpy's included; NaN and infinities too)."""
    return isinstance(x, numbers.Real)
