"""The training loop: an algorithm's update step kept busy by two helper threads (Acme's shape).

- prefetch: a server-streamed SampleStream from replay, decoded to tensors on the device into
  a bounded queue, so the step waits on the network only when replay cannot keep up; compressed
  frames are decompressed here (zstd releases the GIL), into pinned memory on CUDA (impala
  samples its queue one call per batch; ppo samples in the train thread, as its batch needs);
- train (the caller's thread): the algorithm's update step; it hands new priorities to
- priorities: writes them back to replay, coalescing what queued up meanwhile, never
  stalling the step.
Every publish_interval updates the algorithm's parameters become a new version (ppo's every
update: its actors wait for each).
"""

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator

import grpc
import numpy as np
import torch

from apexrl.algorithms.base import Algorithm
from apexrl.algorithms.columns import unpack
from apexrl.common.codec import Packed
from apexrl.config import LearnerConfig
from apexrl.learner import checkpoint
from apexrl.learner.metrics import LearnerMetrics
from apexrl.learner.parameters import ParameterStore
from apexrl.replay.client import ReplayClient

log = logging.getLogger(__name__)


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """The dtype updates autocast to (None: plain float32), from the `precision` setting."""
    if precision not in ("float32", "bfloat16", "auto"):
        raise ValueError(f"precision must be float32, bfloat16 or auto, got {precision!r}")
    if precision == "auto":
        precision = "bfloat16" if native_bfloat16(device) else "float32"
    return torch.bfloat16 if precision == "bfloat16" else None


def native_bfloat16(device: torch.device) -> bool:
    """Whether `device` computes bfloat16 in hardware (emulated, it is slower than float32)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported(including_emulation=False)
    supported = getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    return device.type == "cpu" and supported()


class Learner:
    """An algorithm's Learning, its counters and parameter versions; trains until told to stop."""

    COALESCE = 16  # at most this many updates' priorities go to replay in one call
    PRIORITY_SENDERS = 4  # at most this many priority calls in flight at once

    def __init__(
        self,
        config: LearnerConfig,
        algorithm: Algorithm,
        metrics: LearnerMetrics,
        store: ParameterStore,
    ):
        self.config, self.algorithm, self.metrics, self.store = config, algorithm, metrics, store
        self.device = pick_device(config.device)
        self.autocast_dtype = autocast_dtype(config.precision, self.device)
        precision = "bfloat16 autocast" if self.autocast_dtype else "float32"
        log.info("%s learner on %s, updates in %s", algorithm.name, self.device, precision)
        torch.set_num_threads(config.threads)
        if config.seed:
            torch.manual_seed(config.seed)
        self.learning = algorithm.learning(config, self.device)
        self.columns = {c.name: c for c in algorithm.columns()}
        self.update_step = 0
        self.samples_consumed = 0
        self._gathered: list = []  # ppo: current-version unrolls waiting for a full batch
        self.stop = threading.Event()
        self.helpers: list[threading.Thread] = []
        meta = (
            checkpoint.resume(config, algorithm.name, self.learning)
            if config.checkpoint_dir
            else None
        )
        if meta is not None:
            self.update_step, self.samples_consumed = meta["update_step"], meta["samples_consumed"]
            self.publish(version=meta["version"])
            metrics.update_step.set(self.update_step)
        if self.store.version == 0:
            self.publish()

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

    def checkpoint(self) -> None:
        """Publishes, then writes the algorithm's state and the counters (no pickle)."""
        if not self.config.checkpoint_dir:
            return
        self.publish()  # the checkpoint's online parameters are exactly the newest version
        counters = {
            "update_step": self.update_step,
            "version": self.store.version,
            "samples_consumed": self.samples_consumed,
        }
        try:
            checkpoint.save(self.config, self.algorithm.name, self.learning, counters)
        except OSError as err:  # a full or failing disk: keep training on, keep the old files
            self.metrics.checkpoint_failures.inc()
            log.error("checkpoint failed, previous ones kept: %s", err)

    # --- training ---------------------------------------------------------------------------

    def check_columns(self, columns: dict[str, np.ndarray]) -> None:
        """A sampled batch must carry the algorithm's columns (another algorithm's actors, or a
        table filled for another env, would otherwise fail somewhere deep in the loss)."""
        got = {
            name: (np.dtype(a.dtype), tuple(a.item_shape if isinstance(a, Packed) else a.shape[1:]))
            for name, a in columns.items()
        }
        want = {c.name: (c.dtype, c.shape) for c in self.columns.values()}
        if got != want:
            raise ValueError(
                f"replay columns {got} are not algorithm {self.algorithm.name}'s {want}"
            )

    def check_table(self, info) -> None:
        """The table must suit the algorithm: a queue of unrolls (sampler fifo,
        max_times_sampled 1) for impala and ppo, a replay table (items stay until evicted) for
        dqn and dpg. A mismatch is a configuration error naming the table."""
        name, kind = (
            self.algorithm.name,
            f"sampler {info.sampler}, max_times_sampled {info.max_times_sampled}",
        )
        queue_of_unrolls = info.sampler == "fifo" and info.max_times_sampled == 1
        if self.algorithm.unrolls and not queue_of_unrolls:
            raise ValueError(
                f"replay table {info.name!r} ({kind}): algorithm {name} learns each unroll once,"
                " in order: it needs sampler fifo, max_times_sampled 1 (remover none,"
                " rate_limiter queue)"
            )
        if not self.algorithm.unrolls and (info.max_times_sampled or info.remover == "none"):
            raise ValueError(
                f"replay table {info.name!r} ({kind}, remover {info.remover}) is a queue:"
                f" algorithm {name} samples a replay table (max_times_sampled 0, remover fifo)"
            )

    def decode(self, batch) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
        """A sampled batch's transition fields (frames decompressed), weights and keys; items
        whose frames do not decode are dropped, counted and logged (the first time)."""
        started = time.perf_counter()
        columns, ok = unpack(batch.columns, list(self.columns.values()))
        self.metrics.decode_seconds.inc(time.perf_counter() - started)
        weights, keys = batch.weights, batch.keys
        if not ok.all():
            bad = int((~ok).sum())
            if not self.metrics.decode_failures._value.get():
                log.warning("dropped %d sampled items whose frames do not decode", bad)
            self.metrics.decode_failures.inc(bad)
            columns = {k: v[ok] for k, v in columns.items()}
            weights, keys = weights[ok], keys[ok]
        return columns, weights, keys

    def to_device(self, batch) -> tuple[dict[str, torch.Tensor], torch.Tensor, np.ndarray]:
        columns, weights, keys = self.decode(batch)
        pin = self.device.type == "cuda"

        def move(array: np.ndarray) -> torch.Tensor:
            tensor = torch.from_numpy(np.array(array))
            return (tensor.pin_memory() if pin else tensor).to(self.device, non_blocking=True)

        return {k: move(v) for k, v in columns.items()}, move(weights), np.array(keys)

    def train(self, replay: ReplayClient) -> None:
        """Runs until `stop` is set (or max_updates). Call from its own thread."""
        self.check_table(replay.info())
        batches: queue.Queue = queue.Queue(maxsize=self.config.prefetch)
        priorities: queue.Queue = queue.Queue()
        threads = [
            threading.Thread(target=self._write_priorities, args=(replay, priorities), daemon=True)
        ]
        in_turn = None  # ppo: sampled in this thread, see _current_version
        if self.algorithm.current_version_only:
            in_turn = self._decoded(self._one_call_each(replay, self._missing))
        else:
            threads.append(
                threading.Thread(target=self._prefetch, args=(replay, batches), daemon=True)
            )
        self.helpers = threads  # joined on shutdown: none may be inside gRPC when Python exits
        for thread in threads:
            thread.start()
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
            if in_turn is not None:
                item = next(in_turn, None)  # None: stopping
                if item is not None:
                    item = self._current_version(item)
                if item is None:
                    continue
            else:
                try:
                    item = batches.get(timeout=0.5)
                except queue.Empty:
                    continue
                if isinstance(item, BaseException):
                    raise item
            waited += time.perf_counter() - started
            self.metrics.wait_seconds.inc(time.perf_counter() - started)
            self._update(*item, priorities)
            busy += time.perf_counter() - started
            if self.update_step % 100 == 0:
                self.metrics.wait_fraction.set(waited / busy if busy else 0.0)
                waited = busy = 0.0
            interval = self.config.checkpoint_interval
            if interval > 0 and time.monotonic() - last_checkpoint > interval:
                self.checkpoint()
                last_checkpoint = time.monotonic()
        priorities.put(None)
        threads[0].join(10)

    def _current_version(self, item):
        """ppo: the batch's unrolls of the current version, gathered over sampled batches until
        there are batch_size of them (older ones are dropped and counted); None until then.

        The training thread samples them itself, each call asking for exactly the unrolls the
        batch still lacks (_missing). Sampling ahead, or a full batch_size, waits on unrolls no
        actor writes until the learner publishes whenever older unrolls fill part of a batch
        (an actor that acted again while it waited): the learner then stalled until the
        actors' VERSION_WAIT ran out, and stayed in that step, about a version a second."""
        columns, weights, keys = item
        current = (columns["version"] == self.store.version).cpu().numpy()
        self.metrics.stale_unrolls.inc(int((~current).sum()))
        if current.any():
            index = torch.from_numpy(np.flatnonzero(current)).to(weights.device)
            kept = ({k: v[index] for k, v in columns.items()}, weights[index], keys[current])
            self._gathered.append(kept)
        if sum(len(k) for _, _, k in self._gathered) < self.config.batch_size:
            return None
        parts, self._gathered = self._gathered, []
        columns = {k: torch.cat([c[k] for c, _, _ in parts]) for k in parts[0][0]}
        return columns, torch.cat([w for _, w, _ in parts]), np.concatenate([k for *_, k in parts])

    def _update(self, columns, weights, keys, priorities: queue.Queue) -> None:
        if "version" in columns:  # unrolls: how far behind the learner their actors were
            lag = self.store.version - columns["version"].float().mean().item()
            self.metrics.policy_lag.set(lag)
        with self.autocast():
            td_errors, figures = self.learning.update(columns, weights, self.update_step + 1)
        self.update_step += 1
        self.samples_consumed += len(keys)
        td_errors = td_errors.cpu().numpy()
        if not self.algorithm.unrolls:  # unrolls are consumed once, in order: no priorities
            priorities.put((keys, td_errors + self.config.priority_epsilon))
        # ppo's actors wait for every version; the others take the newest when they pull
        if (
            self.algorithm.current_version_only
            or self.update_step % self.config.publish_interval == 0
        ):
            self.publish()
        m = self.metrics
        m.updates.inc()
        m.update_step.set(self.update_step)
        m.samples.inc(len(keys))
        m.loss.set(figures["loss"])
        m.td_error.set(float(td_errors.mean()))
        m.q_mean.set(figures["q_mean"])
        m.weight_mean.set(float(weights.mean()))
        m.weight_min.set(float(weights.min()))

    def _missing(self) -> int:
        return self.config.batch_size - sum(len(keys) for *_, keys in self._gathered)

    def _decoded(self, sampled: Iterator) -> Iterator:
        """Sampled batches as tensors on the device (to_device); the first one's columns
        checked; a batch whose every item's frames were damaged skipped."""
        checked = False
        for batch in sampled:
            if not checked:
                self.check_columns(batch.columns)
                checked = True
            item = self.to_device(batch)
            if len(item[2]):
                yield item

    def _prefetch(self, replay: ReplayClient, batches: queue.Queue) -> None:
        sampled = (
            self._one_call_each(replay, lambda: self.config.batch_size)
            if self.algorithm.unrolls
            else replay.sample_stream(self.config.batch_size, self.config.beta)
        )
        try:
            for item in self._decoded(sampled):
                while not self.stop.is_set():
                    try:
                        batches.put(item, timeout=0.5)
                        break
                    except queue.Full:
                        continue
                if self.stop.is_set():
                    return
        except Exception as err:  # surfaced in the training thread
            if not self.stop.is_set():
                batches.put(err)

    def _one_call_each(self, replay: ReplayClient, size: Callable[[], int]) -> Iterator:
        """A queue table's batches of size() items, one Sample call each, made when the
        consumer asks for the next. A stream would keep sampling into gRPC's buffers while the
        learner trains; sampled unrolls leave the queue, so a slow learner would empty it (the
        actors, no longer held back, race ahead) and lose every buffered batch when it stops."""
        while not self.stop.is_set():
            try:
                yield replay.sample(size(), self.config.beta)
            except grpc.RpcError as err:  # the queue lacked a batch until the deadline: again
                if err.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                    raise

    def _write_priorities(self, replay: ReplayClient, priorities: queue.Queue) -> None:
        """Writes priorities back until `priorities` yields None (see write_priorities)."""
        write_priorities(
            replay,
            priorities,
            self.stop,
            self.metrics.priority_updates.inc,
            coalesce=self.COALESCE,
            senders=self.PRIORITY_SENDERS,
        )


def write_priorities(
    replay,
    updates: queue.Queue,
    stop: threading.Event,
    sent: Callable[[int], object],
    *,
    coalesce: int,
    senders: int,
) -> None:
    """Writes the (keys, priorities) pairs `updates` yields to `replay` (anything with
    `update_priorities(keys, priorities)`) until it yields None, then returns once every call
    has ended; `sent(n)` counts the priorities of each call that succeeded.

    `senders` threads (this one among them) each coalesce up to `coalesce` queued updates, or
    what arrives in 20 ms, into one call: a replay call costs far more than a few thousand keys
    do, and with several calls in flight the replay works on one while the next travels.
    Calls in flight together may be sent in either order, so for a key in two of them the older
    priority can win; priorities are advisory and the key's next sample sets it again. A failed
    call is logged and dropped for the same reason; once `stop` is set, a failure ends its
    sender quietly (the replay client was closed under it).
    """
    others = [
        threading.Thread(
            target=_send_priorities,
            args=(replay, updates, stop, sent, coalesce),
            name=f"priorities-{i}",
            daemon=True,
        )
        for i in range(1, senders)
    ]
    for thread in others:
        thread.start()
    _send_priorities(replay, updates, stop, sent, coalesce)
    for thread in others:
        thread.join()


def _send_priorities(
    replay,
    updates: queue.Queue,
    stop: threading.Event,
    sent: Callable[[int], object],
    coalesce: int,
) -> None:
    """One sender of write_priorities: coalesce, send, repeat; the None that ends it goes back
    into `updates` for the other senders."""
    done = False
    while not done:
        item = updates.get()
        if item is None:
            updates.put(None)
            return
        pending = [item]
        deadline = time.monotonic() + 0.02
        while len(pending) < coalesce:
            try:
                item = updates.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if item is None:
                updates.put(None)
                done = True
                break
            pending.append(item)
        keys = np.concatenate([k for k, _ in pending])
        values = np.concatenate([p for _, p in pending])
        try:
            replay.update_priorities(keys, values)
        except Exception as err:  # priorities are advisory: log and carry on
            if stop.is_set():
                return
            log.warning("priority update of %d keys failed: %s", len(keys), err)
        else:
            sent(len(keys))
