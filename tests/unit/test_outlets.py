"""An actor's Outlet: an adder's items wait until an insert batch is full (or go at once where
the adder asks), then reach the buffer as one batch with the adder's priorities plus
priority_epsilon, without the fields only acting needed."""

import numpy as np

from apexrl.actor.outlets import Outlet
from apexrl.algorithms.columns import Column


class Adder:
    """Two items per step, each its step's index; priorities 2 * x."""

    table, acting_fields = "default", ("q",)

    def __init__(self, insert_at_once: bool = False):
        self.insert_at_once, self.steps = insert_at_once, 0

    def add(self, step):
        self.steps += 1
        if step is None:  # a step that completes no item
            return None
        x = np.full(2, self.steps, np.float32)
        return {"x": x, "q": x * 10}

    def priorities(self, batch, policy):
        return 2.0 * batch["x"]


class Buffer:
    def __init__(self):
        self.puts = []

    def put(self, columns, priorities):
        self.puts.append((columns, priorities))


class Metrics:  # frame bytes are counted only for compressed columns: none here
    pass


COLUMNS = [Column("x", np.dtype(np.float32), ())]


def test_items_wait_for_a_full_batch_then_go_with_priorities_plus_epsilon():
    buffer = Buffer()
    outlet = Outlet(Adder(), COLUMNS, buffer, insert_batch=5, epsilon=0.25)
    completed = []
    for step in (1, None, 1, 1):
        completed.append(outlet.add(step))
        outlet.flush_if_due(None, Metrics())
    assert completed == [True, False, True, True]
    ((columns, priorities),) = buffer.puts  # 6 items once 5 were reached, none before
    assert columns.keys() == {"x"}  # "q" served acting only
    np.testing.assert_array_equal(columns["x"], [1, 1, 3, 3, 4, 4])
    np.testing.assert_allclose(priorities, 2 * columns["x"] + 0.25)
    assert outlet.pending == [] and outlet.count == 0


def test_an_adder_that_inserts_at_once_flushes_every_item():
    buffer = Buffer()
    outlet = Outlet(Adder(insert_at_once=True), COLUMNS, buffer, insert_batch=64, epsilon=0.0)
    for _ in range(3):
        outlet.add(1)
        outlet.flush_if_due(None, Metrics())
    assert [len(p) for _, p in buffer.puts] == [2, 2, 2]
