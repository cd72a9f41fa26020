"""The newest published parameters, encoded once per version, with their lineage."""

import secrets
import threading
from collections.abc import Callable

import numpy as np

from apexrl.common import tensors
from apexrl.v1 import learner_pb2, tensor_pb2


class ParameterStore:
    """The newest published parameters, encoded once per version.

    `lineage` is random per process: after a kill -9 the resumed learner reissues the version
    numbers published after its last checkpoint, with other weights, under a new lineage.
    """

    def __init__(self):
        self.lineage = secrets.randbits(63) + 1
        self.version = 0
        self.update_step = 0
        self._parameters: dict[str, tensor_pb2.Tensor] = {}
        self._lock = threading.Lock()
        self._listeners: list[Callable[[], None]] = []

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
        with self._lock:
            self.version = self.version + 1 if version is None else version
            self.update_step = update_step
            self._parameters = encoded
            version = self.version
        for listener in self._listeners:
            listener()
        return version

    def fill(
        self, response: learner_pb2.GetParametersResponse, have_version: int, have_lineage: int
    ) -> None:
        with self._lock:
            response.version, response.update_step = self.version, self.update_step
            response.lineage = self.lineage
            if not self.holds(have_version, have_lineage):
                for name, tensor in self._parameters.items():
                    response.parameters[name].CopyFrom(tensor)
