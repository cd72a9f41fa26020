"""The training loop: an algorithm's update step kept busy by two helper threads (Acme's shape).

- prefetch: the algorithm's dataset (algorithms/datasets.py) sampled from replay, decoded to
  tensors on the device into a bounded queue, so the step waits on the network only when
  replay cannot keep up; compressed frames are decompressed here (zstd releases the GIL), into
  pinned memory on CUDA (a dataset that must not run ahead is sampled in the train thread);
- train (the caller's thread): the algorithm's update step; it hands new priorities to
- priorities: writes them back to replay, coalescing what queued up meanwhile, never
  stalling the step (learner/write_back.py).
Every publish_interval updates the algorithm's parameters become a new version (every update
where the dataset needs each batch from the newest version: the actors wait for each).
"""

import logging
import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from apexrl.algorithms.base import Builder
from apexrl.algorithms.columns import unpack
from apexrl.common.errors import InvalidArgument
from apexrl.common.parameters import ParameterStore
from apexrl.config import LearnerConfig
from apexrl.learner import checkpoint, pretraining
from apexrl.learner.device import autocast_dtype, pick_device
from apexrl.learner.metrics import LearnerMetrics
from apexrl.learner.replay_checks import check_columns, check_table
from apexrl.learner.scheduled import ScheduledSettings
from apexrl.learner.write_back import COALESCE, SENDERS, write_priorities
from apexrl.replay.client import Replay
from apexrl.replay.sharded import connect

log = logging.getLogger(__name__)


class Learner:
    """An algorithm's Learning, its counters and parameter versions; trains until told to stop."""

    def __init__(
        self,
        config: LearnerConfig,
        builder: Builder,
        metrics: LearnerMetrics,
        store: ParameterStore,
    ):
        self.config, self.builder, self.metrics, self.store = config, builder, metrics, store
        self.dataset = builder.dataset()
        self.auxiliary = builder.auxiliary_datasets()
        for dataset in self.auxiliary:
            if dataset.prioritized or not dataset.prefetch:
                raise ValueError(
                    f"auxiliary dataset of table {dataset.table!r}: must be prefetched and not"
                    " prioritized (a batch of it joins each update's batch)"
                )
        # Checked before anything is built: a folder that does not fit stops the learner here.
        demonstrations = pretraining.demonstration_pairs(config, builder.spec)
        self.device = pick_device(config.device)
        self.autocast_dtype = autocast_dtype(config.precision, self.device)
        precision = "bfloat16 autocast" if self.autocast_dtype else "float32"
        log.info("%s learner on %s, updates in %s", builder.name, self.device, precision)
        torch.set_num_threads(config.threads)
        if config.seed:
            torch.manual_seed(config.seed)
        self.learning = builder.learning(config, self.device)
        self.scheduled = ScheduledSettings(
            config, builder, self.learning.optimizers(), metrics.scheduled
        )
        self.columns = {c.name: c for c in builder.table_columns(self.dataset.table)}
        self.update_step = 0
        self.samples_consumed = 0
        self.decode_failed = False  # warned once, counted always
        self.checkpointed_changes = 0  # live changes (scheduled.changes) in a checkpoint
        self.stop = threading.Event()
        self.helpers: list[threading.Thread] = []
        meta = (
            checkpoint.resume(config, builder.name, self.learning)
            if config.checkpoint_dir
            else None
        )
        if meta is not None:
            self.update_step, self.samples_consumed = meta["update_step"], meta["samples_consumed"]
            self.publish(version=meta["version"])
            metrics.update_step.set(self.update_step)
            self.resume_live_settings(meta.get("live_settings", {}))
        if meta is None and demonstrations is not None:  # resumed: cloned already
            self.pretrain(*demonstrations)
        if self.store.version == 0:
            self.publish()
        self.scheduled.apply(self.update_step)

    def pretrain(self, observations: np.ndarray, actions: np.ndarray) -> None:
        """Behaviour cloning on the demonstrations, before the first version is published."""
        started = time.perf_counter()
        figures = pretraining.clone(self.learning, observations, actions, self.config, self.device)
        log.info(
            "behaviour cloning: %d steps on %d pairs of %s in %.1f s: loss %.4f, accuracy %.3f",
            self.config.pretrain_steps,
            len(actions),
            self.config.pretrain_demonstrations,
            time.perf_counter() - started,
            figures["loss"],
            figures["accuracy"],
        )
        self.metrics.pretrain_loss.set(figures["loss"])
        self.metrics.pretrain_accuracy.set(figures["accuracy"])

    def resume_live_settings(self, changes: dict[str, float]) -> None:
        """The live changes a checkpoint holds, over the config's values (ValueError: one
        this config cannot take)."""
        for name, value in changes.items():
            try:
                self.scheduled.change(name, value)
            except InvalidArgument as err:
                raise ValueError(f"the checkpoint's live change of {err}") from None
        self.checkpointed_changes = self.scheduled.changes  # in the checkpoint already

    def autocast(self) -> torch.autocast:
        """What updates run under: with precision bfloat16, convolutions and matrix products
        in bfloat16 (AMX on this kind of CPU: a Pong update of 32 ~2x faster); Adam's float32
        state and the weights untouched."""
        dtype = self.autocast_dtype
        return torch.autocast(self.device.type, dtype, enabled=dtype is not None)

    # --- parameters and checkpoints --------------------------------------------------------

    def publish(self, version: int | None = None) -> None:
        version = self.store.publish(self.learning.parameters(), self.update_step, version)
        self.metrics.version.set(version)
        self.metrics.parameter_bytes.set(self.store.nbytes)
        self.metrics.parameter_change_bytes.set(self.store.change_bytes)

    def checkpoint(self) -> None:
        """Publishes, then writes the algorithm's state and the counters (no pickle)."""
        self.checkpointed_changes = self.scheduled.changes
        if not self.config.checkpoint_dir:
            return
        self.publish()  # the newest version is published from the weights checkpointed
        counters = {
            "update_step": self.update_step,
            "version": self.store.version,
            "samples_consumed": self.samples_consumed,
            "live_settings": dict(self.scheduled.live),
        }
        try:
            checkpoint.save(self.config, self.builder.name, self.learning, counters)
        except OSError as err:  # a full or failing disk: keep training on, keep the old files
            self.metrics.checkpoint_failures.inc()
            log.error("checkpoint failed, previous ones kept: %s", err)

    # --- training ---------------------------------------------------------------------------

    def decode(self, batch, declared=None) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
        """A sampled batch's transition fields (frames decompressed), weights and keys; items
        whose frames do not decode are dropped, counted and logged (the first time)."""
        started = time.perf_counter()
        declared = list(self.columns.values()) if declared is None else declared
        columns, ok = unpack(batch.columns, declared)
        self.metrics.decode_seconds.inc(time.perf_counter() - started)
        weights, keys = batch.weights, batch.keys
        if not ok.all():
            bad = int((~ok).sum())
            if not self.decode_failed:
                log.warning("dropped %d sampled items whose frames do not decode", bad)
            self.decode_failed = True
            self.metrics.decode_failures.inc(bad)
            columns = {k: v[ok] for k, v in columns.items()}
            weights, keys = weights[ok], keys[ok]
        return columns, weights, keys

    def to_device(
        self, batch, declared=None
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor, np.ndarray]:
        columns, weights, keys = self.decode(batch, declared)
        pin = self.device.type == "cuda"

        def move(array: np.ndarray) -> torch.Tensor:
            tensor = torch.from_numpy(np.array(array))
            return (tensor.pin_memory() if pin else tensor).to(self.device, non_blocking=True)

        return {k: move(v) for k, v in columns.items()}, move(weights), np.array(keys)

    def train(self, replay: Replay) -> None:
        """Runs until `stop` is set (or max_updates). Call from its own thread."""
        check_table(self.builder, replay.info())
        batches: queue.Queue = queue.Queue(maxsize=self.config.prefetch)
        priorities: queue.Queue = queue.Queue()
        threads = [
            threading.Thread(target=self._write_priorities, args=(replay, priorities), daemon=True)
        ]
        in_turn = None  # a dataset that must not run ahead: sampled in this thread
        if self.dataset.prefetch:
            threads.append(
                threading.Thread(target=self._prefetch, args=(replay, batches), daemon=True)
            )
        else:
            in_turn = self._decoded(self._sample(replay))
        auxiliary = self._auxiliary(threads)
        self.helpers = threads  # joined on shutdown: none may be inside gRPC when Python exits
        for thread in threads:
            thread.start()
        try:
            self._train(in_turn, batches, priorities, auxiliary)
        finally:  # also when sampling failed: the priority writers end, none waits for more
            priorities.put(None)
            threads[0].join(10)
            for _, client, _ in auxiliary:
                client.close()  # ends their prefetch streams

    def _auxiliary(self, threads: list) -> list:
        """(dataset, client, batches) of each auxiliary dataset, its table checked and its
        prefetch thread added to `threads`."""
        auxiliary: list[tuple[Any, Any, queue.Queue]] = []
        for dataset in self.auxiliary:
            client = connect(
                self.config.replay,
                table=dataset.table,
                timeout=30.0,
                retry_seconds=None,
                tls=self.config,
                stop=self.stop,
            )
            try:
                check_table(self.builder, client.info())
            except Exception:
                for opened in [client, *(other for _, other, _ in auxiliary)]:
                    opened.close()
                raise
            batches: queue.Queue = queue.Queue(maxsize=self.config.prefetch)
            args = (client, batches, dataset, self.builder.table_columns(dataset.table))
            threads.append(threading.Thread(target=self._prefetch, args=args, daemon=True))
            auxiliary.append((dataset, client, batches))
        return auxiliary

    def _train(self, in_turn, batches: queue.Queue, priorities: queue.Queue, auxiliary) -> None:
        waited = busy = 0.0
        last_checkpoint = time.monotonic()
        while not self.stop.is_set():
            if self.config.max_updates and self.update_step >= self.config.max_updates:
                log.info(
                    "reached max_updates %d: training stops, parameters still served",
                    self.update_step,
                )
                break
            started = time.perf_counter()
            item = self._next(in_turn, batches)
            if item is not None and auxiliary:
                item = self._join(item, auxiliary)
            if item is None:
                continue
            waited += time.perf_counter() - started
            self.metrics.wait_seconds.inc(time.perf_counter() - started)
            columns, weights, keys = item
            self._update(columns, weights, keys, priorities)
            busy += time.perf_counter() - started
            if self.update_step % 100 == 0:
                self.metrics.wait_fraction.set(waited / busy if busy else 0.0)
                waited = busy = 0.0
            interval = self.config.checkpoint_interval
            changed = self.scheduled.changes != self.checkpointed_changes  # kept at once
            if changed or (interval > 0 and time.monotonic() - last_checkpoint > interval):
                self.checkpoint()
                last_checkpoint = time.monotonic()

    def _next(self, in_turn: Iterator | None, batches: queue.Queue):
        """The next batch to train on, or None (none yet; or stopping)."""
        if in_turn is not None:
            item = next(in_turn, None)  # None: stopping
        else:
            try:
                item = batches.get(timeout=0.5)
            except queue.Empty:
                return None
            if isinstance(item, BaseException):
                raise item
        if item is None:
            return None
        item, dropped = self.dataset.gather(item, self.store.version)
        self.metrics.stale_items.inc(dropped)
        return item

    def _join(self, item, auxiliary):
        """The batch to train on with a batch of each auxiliary table joined to its columns as
        "<table>/<column>"; None if training stops first."""
        columns, weights, keys = item
        for dataset, _, batches in auxiliary:
            while True:
                if self.stop.is_set():
                    return None
                try:
                    extra = batches.get(timeout=0.5)
                    break
                except queue.Empty:
                    continue
            if isinstance(extra, BaseException):
                raise extra
            columns = columns | {f"{dataset.table}/{k}": v for k, v in extra[0].items()}
        return columns, weights, keys

    def _update(self, columns, weights, keys, priorities: queue.Queue) -> None:
        if "version" in columns:  # items that carry their version: how far behind they were
            lag = self.store.version - columns["version"].float().mean().item()
            self.metrics.policy_lag.set(lag)
        self.scheduled.apply(self.update_step)
        weights = self.scheduled.weights(weights, self.update_step)
        with self.autocast():
            td_errors, figures = self.learning.update(columns, weights, self.update_step + 1)
        self.update_step += 1
        self.samples_consumed += len(keys)
        m = self.metrics
        if td_errors is not None:
            errors = td_errors.cpu().numpy()
            m.td_error.set(float(errors.mean()))
            if self.dataset.prioritized:
                priorities.put((keys, errors + self.config.priority_epsilon))
        if (
            self.dataset.publish_every_update
            or self.update_step % self.config.publish_interval == 0
        ):
            self.publish()
        m.updates.inc()
        m.update_step.set(self.update_step)
        m.samples.inc(len(keys))
        m.report(figures)
        m.weight_mean.set(float(weights.mean()))
        m.weight_min.set(float(weights.min()))

    def _decoded(self, sampled: Iterator, declared=None) -> Iterator:
        """Sampled batches as tensors on the device (to_device); the first one's columns
        checked; a batch whose every item's frames were damaged skipped."""
        declared = list(self.columns.values()) if declared is None else declared
        checked = False
        for batch in sampled:
            if not checked:
                check_columns(self.builder, batch.columns, declared)
                checked = True
            item = self.to_device(batch, declared)
            if len(item[2]):
                yield item

    def _sample(self, replay: Replay, dataset=None) -> Iterator:
        dataset = dataset or self.dataset
        size = dataset.batch_size or self.config.batch_size
        return dataset.batches(replay, size, self.scheduled.sampling_beta, self.stop)

    def _prefetch(self, replay: Replay, batches: queue.Queue, dataset=None, declared=None) -> None:
        try:
            for item in self._decoded(self._sample(replay, dataset), declared):
                while not self.stop.is_set():
                    try:
                        batches.put(item, timeout=0.5)
                        break
                    except queue.Full:
                        continue
                if self.stop.is_set():
                    return
        except Exception as err:  # surfaced in the training thread, if it still reads them
            while not self.stop.is_set():
                try:
                    batches.put(err, timeout=0.5)
                    return
                except queue.Full:
                    continue

    def _write_priorities(self, replay: Replay, priorities: queue.Queue) -> None:
        """Writes priorities back until `priorities` yields None (see write_priorities)."""
        write_priorities(
            replay,
            priorities,
            self.stop,
            self.metrics.priority_updates.inc,
            coalesce=COALESCE,
            senders=SENDERS,
        )
