"""The relay's one pull from upstream (the learner, or a relay nearer to it): a thread that
long-polls for each new version and publishes it, under the learner's version number and
lineage, into the relay's ParameterStore, which encodes it once for every caller.

Version semantics are the learner's: within a lineage a version never follows a newer one; a
new lineage (the learner restarted, possibly from an older or another checkpoint) passes
through whatever its version number. Nothing is served that did not come from upstream.
"""

import logging
import threading
import time

import grpc

from apexrl.common.backoff import Backoff
from apexrl.common.client import short_error
from apexrl.common.learner_client import LearnerClient, Parameters
from apexrl.common.parameters import ParameterStore
from apexrl.config import RelayConfig
from apexrl.relay.metrics import RelayMetrics
from apexrl.relay.path import LOOP, PATH_KEY, RelayPath

log = logging.getLogger(__name__)

LONG_POLL_SECONDS = 30.0  # upstream answers the moment it publishes, or after this long


class RelayLoop(ValueError):
    """The relay's upstream leads back to itself: it can never get parameters."""

    def __init__(self, upstream: str):
        super().__init__(
            f"learner: {upstream} leads back to this relay (a relay pointed at itself, or a loop"
            " of relays): point it at the learner, or at a relay nearer to it"
        )


def looped(err: Exception) -> bool:
    """Whether a pull was refused because this relay is upstream of itself."""
    return (
        isinstance(err, grpc.RpcError)
        and err.code() == grpc.StatusCode.FAILED_PRECONDITION
        and LOOP in (err.details() or "")
    )


class Upstream:
    """Pulls every version from `config.learner` into `store` until stop() (or a loop)."""

    def __init__(
        self,
        config: RelayConfig,
        store: ParameterStore,
        metrics: RelayMetrics,
        path: RelayPath,
        on_loop,
    ):
        self.address, self.store, self.metrics, self.path = config.learner, store, metrics, path
        self.min_pull_seconds = config.min_pull_seconds
        self.on_loop = on_loop  # called (from this thread) once a loop is found
        self.algorithm = ""  # the learner's, from its answers
        self.version, self.lineage = 0, 0
        self._stop = threading.Event()
        # Retries of its own (run), so that each try sends the relay's path as it is now.
        self.client = LearnerClient(
            config.learner,
            timeout=30.0,
            retry_seconds=0.0,
            max_message_mb=config.max_message_mb,
            tls=config,
            stop=self._stop,
        )
        self._thread = threading.Thread(target=self._run, name="upstream", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.client.close()  # cancels a long poll in flight
        self._thread.join(10)

    def _run(self) -> None:
        backoff = Backoff(cap=2.0)
        while not self._stop.is_set():
            started = time.perf_counter()
            try:
                params = self.client.get_parameters(
                    self.version,
                    have_lineage=self.lineage,
                    wait_seconds=LONG_POLL_SECONDS if self.version else 0.0,
                    metadata=((PATH_KEY, self.path.upstream()),),
                )
            except Exception as err:  # upstream away or refusing: retry, unless a loop
                if self._stop.is_set():
                    return
                if looped(err):
                    self.on_loop(RelayLoop(self.address))
                    return
                self.metrics.pull_failures.inc()
                log.warning("pull from %s failed (%s)", self.address, short_error(err))
                self._stop.wait(backoff.next_delay())
                continue
            backoff.reset()
            if params.arrays:
                self.take(params, time.perf_counter() - started)
                # At most one version per min_pull_seconds: the next pull then finds the newest.
                self._stop.wait(max(0.0, self.min_pull_seconds - (time.perf_counter() - started)))

    def take(self, params: Parameters, seconds: float) -> None:
        """Publishes a version pulled; never one older than held within its lineage."""
        if params.lineage == self.lineage and params.version <= self.version:
            return
        if self.lineage and params.lineage != self.lineage:
            log.info(
                "upstream lineage changed (%x -> %x): version %d follows %d",
                self.lineage,
                params.lineage,
                params.version,
                self.version,
            )
        self.algorithm = params.algorithm
        self.store.publish(params.arrays, params.update_step, params.version, params.lineage)
        self.version, self.lineage = params.version, params.lineage
        self.metrics.versions_pulled.inc()
        self.metrics.version.set(params.version)
        self.metrics.pull_seconds.observe(seconds)
