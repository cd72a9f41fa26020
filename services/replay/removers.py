"""What an insert does when its slots still hold items: evict them, or wait for room.

Keys are insertion sequence numbers and the item of key k lives in slot k % capacity, so the
item an insert would overwrite is the one of key k - capacity: the oldest. A remover is one
class with a name (the `remover` setting's value) and one registry line (REMOVERS).
"""

from typing import ClassVar

import numpy as np


class Remover:
    """Decides whether the next inserts may take their slots now."""

    name: ClassVar[str]  # the remover setting's value

    def has_room(self, slot_keys: np.ndarray, first_key: int, n: int) -> bool:
        """Whether keys first_key .. first_key + n - 1 may be written now."""
        raise NotImplementedError


class FifoRemover(Remover):
    """At capacity, an insert evicts the items in its slots: the oldest."""

    name = "fifo"

    def has_room(self, slot_keys: np.ndarray, first_key: int, n: int) -> bool:
        return True


class NoRemover(Remover):
    """Nothing is evicted: an insert waits until its slots are free (a queue), that is until
    their items left after their max_times_sampled-th sample (replay/composition.py)."""

    name = "none"

    def has_room(self, slot_keys: np.ndarray, first_key: int, n: int) -> bool:
        slots = (first_key + np.arange(n)) % len(slot_keys)
        return bool((slot_keys[slots] < 0).all())


# The remover setting's values, each the remover it names.
REMOVERS: dict[str, type[Remover]] = {remover.name: remover for remover in (FifoRemover, NoRemover)}
