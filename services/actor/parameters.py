"""The actor's parameter pulls: a background thread that fetches parameters when the actor
loop asks, from the learner, or from parameter relays (`apexrl relay`) with the lease renewed
at the learner (learner.proto: lease_only).

With relays (the actor's `parameters` setting) each pull tries them in order, then the
learner: a relay killed or unreachable costs the actor nothing but a pull from the learner,
and after one whole round without a relay answering the actor pulls from the learner for
RELAY_RETRY_SECONDS before it tries them again. Its place in the ladder comes from the
learner's lease answer either way. A relay whose lineage is not the learner's (a relay behind
another learner) is not used: the learner's parameters are taken meanwhile, and a
disagreement past LINEAGE_GRACE_SECONDS (a relay catches a restarted learner's new lineage
within seconds) stops the actor with an error naming both settings.
"""

import dataclasses
import logging
import threading
import time
from collections.abc import Sequence

import grpc

from apexrl.common.backoff import Backoff
from apexrl.common.client import short_error
from apexrl.common.learner_client import LearnerClient, Parameters

log = logging.getLogger(__name__)

RELAY_RETRY_SECONDS = 30.0  # with no relay answering, pulls go to the learner this long
LINEAGE_GRACE_SECONDS = 10.0  # a relay may serve another lineage than the learner this long


class SettingError(ValueError):
    """A setting that cannot work, found by a pull: the actor stops with it (exit 2)."""


class ParameterPuller:
    """Fetches parameters in the background when asked; the actor loop picks them up (and
    raises `error`, a setting that cannot work, when it is set)."""

    def __init__(
        self, learner: LearnerClient, actor_id: str, metrics, relays: Sequence[LearnerClient] = ()
    ):
        self.learner, self.actor_id, self.metrics = learner, actor_id, metrics
        self.relays = list(relays)
        self.version, self.lineage = 0, 0
        self.error: SettingError | None = None
        self._relays_back_at = 0.0  # monotonic time before which pulls skip the relays
        self._disagree_since: float | None = None  # a relay's lineage is not the learner's
        self._wanted = threading.Event()
        self._wait_seconds = 0.0  # > 0: the next pull is a long poll for a newer version
        self.arrived = threading.Event()  # set while fresh parameters wait to be taken
        self._lock = threading.Lock()
        self._fresh: Parameters | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pull", daemon=True)
        self._thread.start()

    def request(self, wait_seconds: float = 0.0) -> None:
        """Asks for a pull; wait_seconds > 0 makes it a long poll (the learner answers when it
        publishes a version newer than the one held, or after that long)."""
        self._wait_seconds = wait_seconds
        self._wanted.set()

    def take(self) -> Parameters | None:
        with self._lock:
            fresh, self._fresh = self._fresh, None
            self.arrived.clear()
            return fresh

    def _run(self) -> None:
        backoff = Backoff()
        # close() sets _stop before _wanted: a pull that clears _wanted after close() set it
        # still sees _stop at the loop's test.
        while not self._stop.is_set():
            self._wanted.wait()
            if self._stop.is_set():
                return
            try:
                params = self._pull(self._wait_seconds)
            except SettingError as err:  # the actor stops on it
                self.error = err
                self.arrived.set()
                return
            except Exception as err:  # learner away: act on the weights held, retry
                if self._stop.is_set():
                    return
                self.metrics.pull_failures.inc()
                log.warning("parameter pull failed (%s)", short_error(err))
                self._stop.wait(backoff.next_delay())
                continue
            backoff.reset()
            self._wanted.clear()
            if self.version:  # an actor's first pull is not lag (it held no version)
                self.metrics.lag.set(params.version - self.version)
            if params.arrays:
                self.version, self.lineage = params.version, params.lineage
            with self._lock:
                self._fresh = params
                self.arrived.set()

    def _pull(self, wait_seconds: float) -> Parameters:
        """From the first relay that answers (its lineage the learner's), else the learner."""
        if self.relays and time.monotonic() >= self._relays_back_at:
            # Renewed first, as a pull from the learner renews it as the call arrives: a long
            # poll at the relay keeps the lease.
            lease = self._lease()
            for relay in self.relays:
                try:
                    params = relay.get_parameters(
                        self.version, self.actor_id, self.lineage, wait_seconds
                    )
                except Exception as err:
                    if self._stop.is_set():
                        raise
                    log.warning("parameter relay %s: %s", relay.address, short_error(err))
                    continue
                if self._agrees(relay, params, lease):
                    return dataclasses.replace(
                        params,
                        exploration=lease.exploration,
                        actor_index=lease.actor_index,
                        num_actors=lease.num_actors,
                        lease_seconds=lease.lease_seconds,
                    )
                break  # the learner's parameters, this once
            else:
                self._relays_back_at = time.monotonic() + RELAY_RETRY_SECONDS
                self.metrics.relay_fallbacks.inc()
                log.warning(
                    "no parameter relay answers: pulling from the learner for %g s",
                    RELAY_RETRY_SECONDS,
                )
        params = self.learner.get_parameters(
            self.version, self.actor_id, self.lineage, wait_seconds
        )
        if not params.lease_seconds:
            raise self._no_lease()
        return params

    def _lease(self) -> Parameters:
        """The actor's lease renewed at the learner (lease_only)."""
        try:
            lease = self.learner.renew_lease(self.actor_id)
        except grpc.RpcError as err:  # a relay refuses lease_only: FAILED_PRECONDITION
            if err.code() == grpc.StatusCode.FAILED_PRECONDITION:
                raise self._no_lease() from err
            raise
        if not lease.lease_seconds:
            raise self._no_lease()
        return lease

    def _no_lease(self) -> SettingError:
        return SettingError(
            f"learner: {self.learner.address} grants no lease (a parameter relay?): set"
            " `learner` to the learner's address and the relay's as `parameters`"
        )

    def _agrees(self, relay: LearnerClient, params: Parameters, lease: Parameters) -> bool:
        """Whether the relay serves the learner's lineage; SettingError once it has not for
        LINEAGE_GRACE_SECONDS."""
        if params.lineage == lease.lineage:
            self._disagree_since = None
            return True
        now = time.monotonic()
        self._disagree_since = self._disagree_since or now
        if now - self._disagree_since > LINEAGE_GRACE_SECONDS:
            raise SettingError(
                f"parameters: the relay at {relay.address} serves lineage {params.lineage:x},"
                f" the learner at {self.learner.address} (the `learner` setting) has lineage"
                f" {lease.lineage:x}, for over {LINEAGE_GRACE_SECONDS:g} s: the relay pulls"
                " from another learner"
            )
        log.warning(
            "parameter relay %s serves lineage %x, the learner %x: pulling from the learner",
            relay.address,
            params.lineage,
            lease.lineage,
        )
        return False

    def close(self) -> None:
        self._stop.set()
        self._wanted.set()  # wakes a thread that waits for a request
        for client in [*self.relays, self.learner]:
            client.close()
        self._thread.join(5)
