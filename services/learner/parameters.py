"""The published parameters, encoded once per version, with their lineage: the newest, and
as many recent ones as `history_bytes` holds for evaluators that play every version."""

import collections
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from apexrl.common import tensors
from apexrl.v1 import learner_pb2, tensor_pb2


@dataclass
class _Version:
    version: int
    update_step: int
    parameters: dict[str, tensor_pb2.Tensor]
    nbytes: int


class ParameterStore:
    """The published parameters, encoded once per version.

    `lineage` is random per process: after a kill -9 the resumed learner reissues the version
    numbers published after its last checkpoint, with other weights, under a new lineage.
    The newest version is always kept; older ones while all kept versions but the newest fit
    in `history_bytes` of tensor data (in_order callers, learner.proto).
    """

    def __init__(self, history_bytes: int = 0):
        self.lineage = secrets.randbits(63) + 1
        self.history_bytes = history_bytes
        self._kept: collections.deque[_Version] = collections.deque()  # oldest first
        self._older_bytes = 0  # of the kept versions but the newest
        self._lock = threading.Lock()
        self._listeners: list[Callable[[], None]] = []

    @property
    def version(self) -> int:
        """The newest version (0 before the first publish)."""
        return self._kept[-1].version if self._kept else 0

    @property
    def update_step(self) -> int:
        return self._kept[-1].update_step if self._kept else 0

    def on_publish(self, listener: Callable[[], None]) -> None:
        """Calls `listener` (from the publishing thread) after every publish."""
        self._listeners.append(listener)

    def holds(self, version: int, lineage: int) -> bool:
        """Whether (version, lineage) is the newest published."""
        return (version, lineage) == (self.version, self.lineage)

    def publish(
        self, arrays: dict[str, np.ndarray], update_step: int, version: int | None = None
    ) -> int:
        encoded = {name: tensors.to_proto(a) for name, a in arrays.items()}
        nbytes = sum(len(t.data) for t in encoded.values())
        with self._lock:
            version = self.version + 1 if version is None else version
            if self._kept and version <= self._kept[-1].version:  # a resumed numbering
                self._kept.clear()
                self._older_bytes = 0
            if self._kept:  # the newest becomes history
                self._older_bytes += self._kept[-1].nbytes
            self._kept.append(_Version(version, update_step, encoded, nbytes))
            while len(self._kept) > 1 and self._older_bytes > self.history_bytes:
                self._older_bytes -= self._kept.popleft().nbytes
        for listener in self._listeners:
            listener()
        return version

    def fill(
        self,
        response: learner_pb2.GetParametersResponse,
        have_version: int,
        have_lineage: int,
        in_order: bool = False,
    ) -> None:
        """The newest version, or with in_order (and this lineage) the oldest kept one after
        have_version; its parameters unless the caller holds it."""
        with self._lock:
            answer = self._kept[-1] if self._kept else _Version(0, 0, {}, 0)
            if in_order and have_lineage == self.lineage:
                answer = next((v for v in self._kept if v.version > have_version), answer)
            response.version, response.update_step = answer.version, answer.update_step
            response.newest_version, response.lineage = self.version, self.lineage
            if not self.holds(have_version, have_lineage):
                for name, tensor in answer.parameters.items():
                    response.parameters[name].CopyFrom(tensor)
