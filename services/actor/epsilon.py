"""Per-actor exploration rates from the Ape-X paper (Horgan et al. 2018)."""


def epsilon_ladder(i: int, n: int, base: float = 0.4, alpha: float = 7.0) -> float:
    """Epsilon of actor i of n: base ** (1 + alpha * i / (n - 1)); a lone actor gets base.

    With the defaults actor 0 explores with 0.4 and actor n-1 with 0.4 ** 8.
    """
    if n < 1:
        raise ValueError(f"n (number of actors) must be >= 1, got {n}")
    if not 0 <= i < n:
        raise ValueError(f"i (actor index) must be in [0, n) = [0, {n}), got {i}")
    if n == 1:
        return base
    return base ** (1.0 + alpha * i / (n - 1))
