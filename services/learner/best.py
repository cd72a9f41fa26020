"""The best model: the parameters an evaluation scored highest, kept durably by the learner.

The evaluator is stateless (a Deployment without a volume), so it sends the parameters it
played, with their returns and the protocol, to the learner, which owns the checkpoint
volume. A report is kept when its mean return beats the best kept so far (ties keep the
earlier version): the "best" checkpoint holds exactly the weights that earned the score.
"""

import dataclasses
import errno
import logging
import math
import threading

import numpy as np

from apexrl.common import checkpoint, tensors
from apexrl.common.errors import FailedPrecondition, Internal, InvalidArgument, ResourceExhausted
from apexrl.v1 import learner_pb2

log = logging.getLogger(__name__)

KIND = "best"  # checkpoint kind: best-<sequence>.ckpt beside the learner's own checkpoints


def read_best(directory: str) -> tuple[dict, dict[str, np.ndarray]] | None:
    """(meta, arrays) of the best model kept in `directory`, or None."""
    found = checkpoint.load_newest(directory, KIND) if directory else None
    return None if found is None else (found[1], found[2])


class BestModel:
    """Validates evaluation reports and keeps the best one as a checkpoint."""

    def __init__(self, config, reference: dict[str, np.ndarray]):
        """config: the learner's (checkpoint_dir, env, agent settings for the meta);
        reference: the network's state, whose names, dtypes and shapes reports must match."""
        self.config = config
        self.shapes = {name: (a.dtype, a.shape) for name, a in reference.items()}
        self.version, self.mean_return = 0, -math.inf
        self._lock = threading.Lock()
        kept = read_best(config.checkpoint_dir)
        if kept is not None:
            self.version, self.mean_return = kept[0]["version"], kept[0]["mean_return"]
            log.info(
                "best model so far: version %d, mean return %.1f", self.version, self.mean_return
            )

    def _decode(self, request: learner_pb2.ReportEvaluationRequest) -> dict[str, np.ndarray]:
        if request.version == 0:
            raise InvalidArgument("version", "must be >= 1 (a published version)")
        if not request.returns:
            raise InvalidArgument("returns", "no episodes")
        if not all(math.isfinite(r) for r in request.returns):
            raise InvalidArgument("returns", "a return is NaN or infinite")
        if request.env != self.config.env:
            raise InvalidArgument("env", f"{request.env!r}, the learner trains {self.config.env!r}")
        if set(request.parameters) != set(self.shapes):
            raise InvalidArgument(
                "parameters", f"names {sorted(request.parameters)}, expected {sorted(self.shapes)}"
            )
        arrays: dict[str, np.ndarray] = {}
        for name, tensor in request.parameters.items():
            field = f'parameters["{name}"]'
            array = tensors.array_from_proto(tensor, field)
            dtype, shape = self.shapes[name]
            if array.dtype != dtype or array.shape != shape:
                raise InvalidArgument(
                    field, f"{array.dtype}{list(array.shape)}, expected {dtype}{list(shape)}"
                )
            arrays[name] = array
        return arrays

    def report(
        self, request: learner_pb2.ReportEvaluationRequest
    ) -> learner_pb2.ReportEvaluationResponse:
        """Called from a worker thread (it may write a checkpoint)."""
        arrays = self._decode(request)
        if not self.config.checkpoint_dir:
            raise FailedPrecondition("checkpoint_dir", "not set: nowhere durable to keep it")
        returns = np.array(request.returns)
        mean = float(returns.mean())
        with self._lock:  # one writer at a time; the comparison and the write go together
            kept = mean > self.mean_return
            if kept:
                self._write(request, arrays, returns)
                self.version, self.mean_return = request.version, mean
            return learner_pb2.ReportEvaluationResponse(
                kept=kept, best_version=self.version, best_mean_return=self.mean_return
            )

    def _write(self, request, arrays: dict[str, np.ndarray], returns: np.ndarray) -> None:
        meta = {
            "version": request.version,
            "lineage": request.lineage,
            "update_step": request.update_step,
            "mean_return": float(returns.mean()),
            "returns": returns.tolist(),
            "protocol": {
                "env": request.env,
                "episodes": len(returns),
                "first_seed": request.first_seed,
                "epsilon": request.epsilon,
            },
            "config": dataclasses.asdict(self.config),
        }
        try:
            path, _ = checkpoint.write_checkpoint(
                self.config.checkpoint_dir,
                KIND,
                meta,
                {f"online/{k}": v for k, v in arrays.items()},
            )
        except OSError as err:
            full = err.errno in (errno.ENOSPC, errno.EDQUOT)
            raise (ResourceExhausted if full else Internal)(
                "checkpoint_dir", f"writing the best model failed, the previous one kept: {err}"
            ) from err
        log.info(
            "best model: version %d (update %d), mean return %.1f over %d episodes -> %s",
            request.version,
            request.update_step,
            meta["mean_return"],
            len(returns),
            path,
        )
