"""The published parameters, encoded once per version, with their lineage: the newest, and
as many recent ones as `history_bytes` holds for evaluators that play every version; and
which rows of each array changed at each of the last CHANGE_VERSIONS versions, so that a caller
holding a recent version pulls only the rows that changed since (learner.proto's
accept_changes): a DND whose update touches a fraction of its slots, an embedding table.

Encoded once means serialized once: a version's parameters (and each change set) are kept as
the wire bytes of their GetParametersResponse fields, and an answer is the caller's few fields
serialized, followed by those bytes. Serialized protobuf messages concatenated parse as one
message holding the fields of both, so the caller decodes exactly what a response built field
by field would give, while the learner copies the bytes once per call instead of copying and
encoding every tensor (6.75 MB for the Atari network) for every caller.

The learner publishes its own versions under its own lineage; a parameter relay (relay/)
publishes the versions it pulls, under the lineage they came with, and may skip versions (it
pulls the newest): change sets span the versions actually published, whatever their numbers."""

import collections
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from apexrl.common import tensors
from apexrl.v1 import learner_pb2

CHANGE_VERSIONS = 16  # versions whose changed rows are kept (learner.proto: accept_changes)
INDEX_BYTES = 4  # an INT32 row index


def changed_rows(new: np.ndarray, old: np.ndarray | None) -> np.ndarray | None:
    """Which rows (first axis) of `new` differ from `old`; None: the whole array is new (no
    old one, another shape or dtype, or nothing to index)."""
    if old is None or new.shape != old.shape or new.dtype != old.dtype or new.size == 0:
        return None
    return (new != old).reshape(len(new), -1).any(axis=1)


def worth_rows(array: np.ndarray, rows: np.ndarray) -> bool:
    """Whether sending `rows` (a mask) with their indices is smaller than the whole array."""
    count = int(rows.sum())
    return count * (array.nbytes // max(len(array), 1) + INDEX_BYTES) < array.nbytes


@dataclass
class _Version:
    version: int
    update_step: int
    payload: bytes  # GetParametersResponse.parameters, serialized
    nbytes: int  # of tensor data


@dataclass
class _Changes:
    payload: bytes  # GetParametersResponse.parameters and .rows of the change set, serialized
    nbytes: int


class ParameterStore:
    """The published parameters, encoded once per version.

    `lineage` is random per process: after a kill -9 the resumed learner reissues the version
    numbers published after its last checkpoint, with other weights, under a new lineage.
    The newest version is always kept; older ones while all kept versions but the newest fit
    in `history_bytes` of tensor data (in_order callers, learner.proto).
    """

    def __init__(self, history_bytes: int = 0):
        self.lineage = secrets.randbits(63) + 1  # a relay's store takes its learner's (publish)
        self.history_bytes = history_bytes
        self._kept: collections.deque[_Version] = collections.deque()  # oldest first
        self._older_bytes = 0  # of the kept versions but the newest
        self._lock = threading.Lock()
        self._listeners: list[Callable[[], None]] = []
        self._arrays: dict[str, np.ndarray] = {}  # the newest version's
        # (version before, version, {name: rows that changed since the version before, None:
        # all}), oldest first
        self._changes: collections.deque = collections.deque(maxlen=CHANGE_VERSIONS)
        self._change_sets: dict[int, _Changes | None] = {}  # for the newest, by base version
        self.change_bytes = 0  # what a caller holding the version before the newest pulls

    @property
    def nbytes(self) -> int:
        """Bytes of the newest version's parameters."""
        return self._kept[-1].nbytes if self._kept else 0

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
        self,
        arrays: dict[str, np.ndarray],
        update_step: int,
        version: int | None = None,
        lineage: int | None = None,
    ) -> int:
        """Publishes `arrays` as `version` (default: the next) of `lineage` (default: this
        store's own). A version not above the newest (a resumed numbering) or another lineage
        starts afresh: nothing kept before it is served or spans it in a change set."""
        encoded = learner_pb2.GetParametersResponse()
        for name, array in arrays.items():
            tensors.to_proto(array, encoded.parameters[name])
        nbytes = sum(len(t.data) for t in encoded.parameters.values())
        payload = encoded.SerializeToString()
        changes = {name: changed_rows(a, self._arrays.get(name)) for name, a in arrays.items()}
        with self._lock:
            version = self.version + 1 if version is None else version
            renumbered = self._kept and version <= self._kept[-1].version
            if renumbered or (lineage is not None and lineage != self.lineage):
                self.lineage = self.lineage if lineage is None else lineage
                self._kept.clear()
                self._older_bytes = 0
                self._changes.clear()
            if set(arrays) != set(self._arrays):  # arrays added or gone: no change set spans it
                self._changes.clear()
            self._arrays = arrays
            self._changes.append((self.version, version, changes))
            if self._kept:  # the newest becomes history
                self._older_bytes += self._kept[-1].nbytes
            self._kept.append(_Version(version, update_step, payload, nbytes))
            while len(self._kept) > 1 and self._older_bytes > self.history_bytes:
                self._older_bytes -= self._kept.popleft().nbytes
            self._change_sets = {}
            # What a caller one version behind pulls (encoded now: most callers are).
            last = self._change_set(self._changes[-1][0])
            self.change_bytes = nbytes if last is None else last.nbytes
        for listener in self._listeners:
            listener()
        return version

    def newest_head(self, head: learner_pb2.GetParametersResponse) -> bytes:
        """`head` with the newest version's numbers and no parameters, serialized (a lease
        renewal: learner.proto's lease_only)."""
        with self._lock:
            head.version = head.newest_version = self.version
            head.update_step, head.lineage = self.update_step, self.lineage
        return head.SerializeToString()

    def serialize(
        self,
        head: learner_pb2.GetParametersResponse,
        have_version: int,
        have_lineage: int,
        in_order: bool = False,
        accept_changes: bool = False,
    ) -> bytes:
        """The answer to a caller, serialized: `head` (the caller's own fields: its lease) with
        the version answered, the newest, or with in_order (and this lineage) the oldest kept
        one after have_version; then its parameters, unless the caller holds it: with
        accept_changes, only what changed since have_version where that is known and smaller.
        The parameters are the bytes encoded at publish, never encoded again here."""
        with self._lock:
            answer = self._kept[-1] if self._kept else _Version(0, 0, b"", 0)
            if in_order and have_lineage == self.lineage:
                answer = next((v for v in self._kept if v.version > have_version), answer)
            head.version, head.update_step = answer.version, answer.update_step
            head.newest_version, head.lineage = self.version, self.lineage
            if self.holds(have_version, have_lineage):
                return head.SerializeToString()
            changes = None
            if accept_changes and have_lineage == self.lineage and answer.version == self.version:
                changes = self._change_set(have_version)
            payload = answer.payload
            if changes is not None:
                head.changes_from, payload = have_version, changes.payload
        return b"".join((head.SerializeToString(), payload))

    def _change_set(self, since: int) -> "_Changes | None":
        """The newest version over `since` (rows that changed, or whole arrays), encoded once
        per base version; None when the changes since are not all known or not smaller."""
        if since in self._change_sets:
            return self._change_sets[since]
        # Every change since is kept when a kept publish came right after `since`.
        if not since or not any(before == since for before, _, _ in self._changes):
            return None
        later = [c for _, v, c in self._changes if v > since]
        plan: dict[str, np.ndarray | None] = {}  # name -> the rows to send, None: whole
        nbytes = 0
        for name, array in self._arrays.items():
            masks = [c[name] for c in later]
            rows = None if any(m is None for m in masks) else np.logical_or.reduce(masks)
            if rows is not None and not rows.any():
                continue
            if rows is not None and worth_rows(array, rows):
                changed = np.flatnonzero(rows).astype(np.int32)
                plan[name] = changed
                nbytes += len(changed) * (array.nbytes // len(array) + INDEX_BYTES)
            else:
                plan[name] = None
                nbytes += array.nbytes
        result = None
        if nbytes < self.nbytes:  # sized first: a dense network's is never encoded twice
            encoded = learner_pb2.GetParametersResponse()
            for name, indices in plan.items():
                array = self._arrays[name]
                if indices is None:
                    tensors.to_proto(array, encoded.parameters[name])
                else:
                    tensors.to_proto(indices, encoded.rows[name])
                    tensors.to_proto(array[indices], encoded.parameters[name])
            result = _Changes(encoded.SerializeToString(), nbytes)
        self._change_sets[since] = result
        return result
