"""A member of the population: a local-mode run (its own folder, replay, learner, actors and
evaluator, supervised by local mode's Run), its metrics.csv rows, and exploit: the winner's
newest learner checkpoint copied atomically into the member's checkpoint folder, the explored
settings in its live changes, then the member started again from it.

What the copy holds: the winner's learner state (parameters, target network, optimizer
state, update step and version, so every schedule goes on where the winner's was), its live
changes with the explored settings over them, and a `pbt` record of where it came from. The
member's replay starts empty: its actors refill it from the copied parameters (off-policy
algorithms learn from any behaviour; on-policy ones use only fresh items anyway).

The copy is one checkpoint write (common/checkpoint.py: a temporary file, fsync, rename), made
while the member is stopped: killed at any point, the member's folder holds its own newest
checkpoint or the complete copy, never a mix, and its learner restores exactly that.
"""

import csv
import math
import time
from pathlib import Path

from apexrl.common import checkpoint
from apexrl.learner.checkpoint import KIND as LEARNER
from apexrl.local.monitoring import FIELDS, collect
from apexrl.local.supervision import Run

# A member's processes must serve within this. More than local mode's 120 s: a member starts
# again at every copy, beside the other members' training, and on a busy 2-core machine a
# restarted learner took over 120 s (load average near 40).
START_SECONDS = 300.0


class Member:
    def __init__(self, index: int, run: Run, settings: dict[str, float]):
        self.index, self.run, self.settings = index, run, dict(settings)
        self.name = run.run_dir.name
        self.rows: list[dict] = []
        self.previous: dict | None = None  # this start's previous row, as collect() gave it
        self.steps_before = 0.0  # env steps of the member's earlier starts
        self.first_row = 0  # the first row of the member's current start
        self.starts = 0
        self.launched = 0.0  # time.monotonic() of the current start
        self.file = open(run.run_dir / "metrics.csv", "w", newline="")  # noqa: SIM115
        self.writer = csv.DictWriter(self.file, FIELDS)
        self.writer.writeheader()

    @property
    def checkpoint_dir(self) -> Path:
        return self.run.checkpoint_dir

    def launch(self) -> None:
        """Starts the member's replay, learner and actors without waiting (from the main
        thread: a child gets SIGTERM when the thread that started it ends); poll() starts the
        evaluator once they serve, as local mode does once the learner serves. A member
        started again keeps its earlier logs in logs-<n>."""
        logs = self.run.run_dir / "logs"
        if self.starts and logs.exists():
            logs.rename(self.run.run_dir / f"logs-{self.starts}")
            logs.mkdir()
        self.starts += 1
        self.run.children, self.run.evaluator = [], None
        self.run.start_all(wait=False)
        self.launched = time.monotonic()

    def poll(self) -> None:
        """Starts the evaluator once the launched processes all serve; RuntimeError naming
        the member when one has not in START_SECONDS."""
        if self.run.evaluator is not None:
            return
        if all(child.ready_file.exists() for child in self.run.children):
            self.run.wait_ready(self.run.children)  # reads their ports: ready already
            self.run.start_evaluator()
        elif time.monotonic() - self.launched > START_SECONDS:
            late = [c.name for c in self.run.children if not c.ready_file.exists()]
            raise RuntimeError(f"{self.name}: {', '.join(late)} did not start in {START_SECONDS} s")

    def stop(self) -> None:
        self.run.stop_all()

    def progress(self, seconds: float) -> dict:
        """A metrics.csv row (seconds since the population started; env steps over every
        start of the member)."""
        row = collect(self.run, seconds, self.previous)
        self.previous = dict(row)
        row["env_steps"] += self.steps_before
        self.rows.append(row)
        self.writer.writerow(row)
        self.file.flush()
        return row

    @property
    def score(self) -> float:
        """The member's latest evaluation since it last started (NaN: none yet)."""
        return self.rows[-1]["eval_mean_return"] if len(self.rows) > self.first_row else math.nan

    def restarted(self, seconds: float, update_step: float) -> None:
        """Counts from 0 again: the new processes' counters."""
        self.steps_before = self.rows[-1]["env_steps"] if self.rows else 0.0
        self.first_row = len(self.rows)
        self.previous = {"seconds": seconds, "env_steps": 0.0, "updates": update_step}

    def close(self) -> None:
        self.file.close()


def copy_state(winner: Path, loser: Path, settings: dict[str, float], record: dict) -> dict | None:
    """Writes `winner`'s newest learner checkpoint as `loser`'s newest, `settings` over its
    live changes and `record` (plus the source file) as its `pbt` entry; returns the copy's
    meta with its path as "path", or None when the winner has no checkpoint yet. Call it
    while the loser's learner is stopped (one writer per folder)."""
    found = checkpoint.load_newest(winner, LEARNER)
    if found is None:
        return None
    source, meta, arrays = found
    meta = {
        **meta,
        "live_settings": {**meta.get("live_settings", {}), **settings},
        "pbt": {**record, "source": str(source)},
    }
    path, _ = checkpoint.write_checkpoint(loser, LEARNER, meta, arrays)
    return {**meta, "path": str(path)}
