"""A replay checkpoint taken over gRPC while inserts and priority updates keep arriving over
gRPC holds the table exactly as it was when the checkpoint began (the copy is taken a chunk
at a time with calls served in between: replay/snapshot.py)."""

import gc
import threading

import numpy as np

from apexrl.replay import server, snapshot
from apexrl.replay.table import Table
from tests.conftest import checkpoint_digest, in_process_replay, transitions, wait_for


def test_a_checkpoint_holds_the_table_as_of_its_start_while_calls_change_it(tmp_path, monkeypatch):
    # Small chunks: the copy takes hundreds of turns of the loop, calls land between them.
    monkeypatch.setattr(snapshot, "CHUNK", 32)
    at_start: list[str] = []
    during = {"inserts": 0, "updates": 0}
    begin, insert, stage = Table.begin_snapshot, Table.insert, Table.stage_priorities

    def recording_begin(self):
        at_start.append(self.digest())  # on the loop, nothing between this and the copy's start
        return begin(self)

    def counting_insert(self, *args, **kwargs):
        during["inserts"] += self._snapshot is not None
        return insert(self, *args, **kwargs)

    def counting_stage(self, *args, **kwargs):
        during["updates"] += self._snapshot is not None
        return stage(self, *args, **kwargs)

    monkeypatch.setattr(Table, "begin_snapshot", recording_begin)
    monkeypatch.setattr(Table, "insert", counting_insert)
    monkeypatch.setattr(Table, "stage_priorities", counting_stage)
    directory = tmp_path / "checkpoints"
    with in_process_replay(tmp_path, capacity=20_000, checkpoint_dir=str(directory)) as replay:
        with replay.client() as client:
            first = client.insert(transitions(15_000), np.ones(15_000)).first_key
            stop, rounds = threading.Event(), []

            def churn() -> None:
                rng = np.random.default_rng(0)
                with replay.client() as other:
                    start = 15_000
                    while not stop.is_set():
                        other.insert(transitions(8, start=start), np.full(8, 2.0))
                        keys = first + rng.choice(15_000, 64, replace=False)
                        other.update_priorities(keys, rng.uniform(0.1, 9.0, 64))
                        start += 8
                        rounds.append(start)

            thread = threading.Thread(target=churn)
            thread.start()
            checked = []  # (calls that landed mid-copy, digest at its start, digest written)
            try:
                wait_for(lambda: len(rounds) > 3, 10, "inserts and updates under way")
                # Until both kinds of call land during one copy (how soon is the load's doing:
                # on a busy machine the churn thread may get no turn in a copy); every
                # checkpoint taken must hold the table as of its start.
                for _ in range(20):
                    at_start.clear()
                    during.update(inserts=0, updates=0)
                    written = client.checkpoint().path
                    checked.append((dict(during), at_start[0], checkpoint_digest(written)))
                    if during["inserts"] and during["updates"]:
                        break
            finally:
                stop.set()
                thread.join(10)
        live = replay.table.digest()
    for _, at_its_start, in_its_file in checked:
        assert in_its_file == at_its_start
    landed, at_its_start, _ = checked[-1]
    assert landed["inserts"] > 0 and landed["updates"] > 0, checked  # calls landed mid-copy
    assert live != at_its_start


def test_no_copy_of_a_table_outlives_its_checkpoint_write(tmp_path, monkeypatch):
    """When the heap is trimmed after the write, nothing holds a snapshot (its chunks are a
    table's size of copies): what is still referenced then stays in the replay's RSS."""
    live_at_trim = []

    def counting_trim() -> None:
        gc.collect()
        live_at_trim.append(sum(isinstance(o, snapshot.Snapshot) for o in gc.get_objects()))

    monkeypatch.setattr(server, "trim_heaps", counting_trim)
    with in_process_replay(tmp_path, capacity=20_000, checkpoint_dir=str(tmp_path / "c")) as replay:
        with replay.client() as client:
            client.insert(transitions(15_000), np.ones(15_000))
            client.checkpoint()
            client.checkpoint()
    assert live_at_trim == [0, 0, 0]  # the two asked for and the one at stop
