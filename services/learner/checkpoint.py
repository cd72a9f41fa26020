"""The learner's checkpoint: the algorithm's state (Learning.state()) plus the counters.

meta: update_step, version, samples_consumed, algorithm, config, and the algorithm's extras;
arrays: the algorithm's (published parameters under "online/"). Written atomically by
common/checkpoint.py (sha256 per header and array, no pickle).
"""

import dataclasses
import logging
import time

from apexrl.algorithms.base import Learning
from apexrl.common import checkpoint

log = logging.getLogger(__name__)

KIND = "learner"


def save(config, algorithm: str, learning: Learning, counters: dict) -> None:
    """Writes one checkpoint; a failing disk is logged and raised as OSError (the caller
    decides whether that stops anything)."""
    arrays, extras = learning.state()
    meta = {**counters, "algorithm": algorithm, **extras, "config": dataclasses.asdict(config)}
    started = time.perf_counter()
    path, size = checkpoint.write_checkpoint(config.checkpoint_dir, KIND, meta, arrays)
    log.info(
        "checkpoint %s: update %d, version %d, %d bytes in %.2f s",
        path,
        counters["update_step"],
        counters["version"],
        size,
        time.perf_counter() - started,
    )


def resume(config, algorithm: str, learning: Learning) -> dict | None:
    """Loads the newest readable checkpoint into `learning`; returns its meta (None: none).

    ValueError when it holds another algorithm's state: the learner must not start on it.
    """
    found = checkpoint.load_newest(config.checkpoint_dir, KIND)
    if found is None:
        log.info("no learner checkpoint in %s: starting fresh", config.checkpoint_dir)
        return None
    path, meta, arrays = found
    held = meta.get("algorithm", "an unnamed algorithm")
    if held != algorithm:
        raise ValueError(
            f"checkpoint_dir: {path} holds a {held} learner's state, this learner runs"
            f" algorithm {algorithm}: point it at another directory or set algorithm = {held}"
        )
    learning.load_state(arrays, meta)
    log.info(
        "resumed from %s: update %d, parameter version %d",
        path,
        meta["update_step"],
        meta["version"],
    )
    return meta
