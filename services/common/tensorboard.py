"""Scalars as TensorBoard event files (`--tensorboard DIR`).

Written by TensorBoard's own EventFileWriter (the `tensorboard` package, whose reader opens
them; torch.utils.tensorboard writes through the same class). Unlike tensorboardX, which
imports torch whenever it is installed, it imports neither torch nor TensorFlow, so local
mode's parent process, which never imports torch, writes with the same code as the learner
and the evaluator.
"""

import math
import threading
import time

import prometheus_client

FLUSH_SECONDS = 5.0  # the writer's queue reaches the file at least this often


class Scalars:
    """An event file in `logdir`; values that are not finite (no evaluation yet) are skipped."""

    def __init__(self, logdir: str):
        try:
            from tensorboard.compat.proto import event_pb2, summary_pb2
            from tensorboard.summary.writer.event_file_writer import EventFileWriter
        except ImportError as err:
            raise ValueError(
                "tensorboard: writing event files needs tensorboard"
                " (pip install apexrl[tensorboard])"
            ) from err
        self.event, self.summary = event_pb2.Event, summary_pb2.Summary
        try:
            self.writer = EventFileWriter(logdir, flush_secs=FLUSH_SECONDS)
        except OSError as err:
            raise ValueError(f"tensorboard: cannot write to {logdir} ({err})") from err

    def add(self, values: dict[str, float], step: int, walltime: float | None = None) -> None:
        tagged = [
            self.summary.Value(tag=tag, simple_value=value)
            for tag, value in values.items()
            if math.isfinite(value)
        ]
        summary = self.summary(value=tagged)
        self.writer.add_event(
            self.event(wall_time=walltime or time.time(), step=step, summary=summary)
        )

    def close(self) -> None:
        self.writer.close()


def unlabelled_values(
    registry: prometheus_client.CollectorRegistry, prefix: str
) -> dict[str, float]:
    """The registry's gauges and counters named prefix*, without labels, by sample name."""
    values = {}
    for family in registry.collect():
        if family.type not in ("gauge", "counter") or not family.name.startswith(prefix):
            continue
        for sample in family.samples:
            if not sample.labels and not sample.name.endswith("_created"):
                values[sample.name] = sample.value
    return values


class RegistryScalars:
    """A service's own metrics as scalars: every `interval` seconds, its gauges and counters
    named `prefix`* (tag "<section>/<rest of the name>"), at the step the `step` sample holds,
    written when that step has moved since the last write. Reads the registry the /metrics
    endpoint serves, so the event files and Prometheus hold the same numbers."""

    def __init__(
        self,
        registry: prometheus_client.CollectorRegistry,
        logdir: str,
        prefix: str,
        step: str,
        section: str,
        interval: float = 1.0,
    ):
        self.registry, self.prefix, self.step_name = registry, prefix, step
        self.section, self.interval = section, interval
        self.scalars = Scalars(logdir)
        self.last_step: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tensorboard", daemon=True)

    def start(self) -> "RegistryScalars":
        self._thread.start()
        return self

    def write(self) -> None:
        """One write of the current values, if the step moved."""
        values = unlabelled_values(self.registry, self.prefix)
        step = values.get(self.step_name)
        if step is None or step == self.last_step:
            return
        self.last_step = step
        tags = {f"{self.section}/{name[len(self.prefix) :]}": v for name, v in values.items()}
        self.scalars.add(tags, int(step), time.time())

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.write()

    def close(self) -> None:
        """Writes the final values and closes the file."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        self.write()
        self.scalars.close()
