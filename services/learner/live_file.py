"""The learner's live file (`live_file`): `NAME = VALUE` lines of TOML, the settings that may
change during a run (learner/scheduled.py), read at start and again whenever the file changes
(its modification time or size, looked at every POLL_SECONDS). Each value that differs from
the file's previous one becomes a live change, as `apexrl set` makes one.

In Kubernetes the file is a ConfigMap key mounted as a volume (not through subPath): the
kubelet replaces it in place when the ConfigMap changes, within its sync period (about a
minute), and the running learner takes it without a restart.

At start a file the learner cannot take stops it (ValueError naming the file and the setting);
later, a line it refuses is logged and counted (`apexrl_learner_live_file_failures_total`),
and the other lines still apply.
"""

import logging
import os
import threading
import tomllib

import prometheus_client

from apexrl.common.errors import InvalidArgument
from apexrl.learner.scheduled import ScheduledSettings

log = logging.getLogger(__name__)

POLL_SECONDS = 2.0


class LiveFile:
    def __init__(
        self, path: str, scheduled: ScheduledSettings, failures: prometheus_client.Counter
    ):
        self.path, self.scheduled, self.failures = path, scheduled, failures
        self.seen: tuple[int, int] | None = None  # (mtime_ns, size) last read
        self.applied: dict[str, float] = {}  # the file's values as last applied

    def read(self) -> dict[str, float]:
        """The file's settings; ValueError naming the file and the line it cannot read."""
        with open(self.path, "rb") as fh:
            data = tomllib.load(fh)
        for name, value in data.items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"{self.path}: {name}: must be a number, got {value!r}")
        return {name: float(value) for name, value in data.items()}

    def start(self) -> None:
        """Applies the file at start-up: ValueError for anything it cannot take."""
        try:
            self.check()
        except (OSError, tomllib.TOMLDecodeError) as err:
            raise ValueError(f"live_file: {err}") from None
        except InvalidArgument as err:
            raise ValueError(f"live_file {self.path}: {err}") from None

    def check(self) -> None:
        """Reads the file if it changed and applies the values that differ from its last ones."""
        stat = os.stat(self.path)
        if (stat.st_mtime_ns, stat.st_size) == self.seen:
            return
        self.seen = (stat.st_mtime_ns, stat.st_size)
        refused = []
        for name, value in self.read().items():
            if self.applied.get(name) == value:
                continue
            try:
                self.scheduled.change(name, value)
            except InvalidArgument as err:
                refused.append(err)  # tried again when the file changes again
                continue
            self.applied[name] = value
        if refused:
            raise refused[0]

    def watch(self, stop: threading.Event) -> None:
        """check() every POLL_SECONDS until `stop`; a failure is logged and counted."""
        while not stop.wait(POLL_SECONDS):
            try:
                self.check()
            except (OSError, ValueError, tomllib.TOMLDecodeError, InvalidArgument) as err:
                self.failures.inc()
                log.error("live file %s: %s (the rest of it still applies)", self.path, err)
