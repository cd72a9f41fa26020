"""Long polls on a ParameterStore (GetParameters with wait_seconds), shared by the learner's
and the parameter relay's servicers: a poll returns when a version newer than the caller's is
published, after its wait, just before its deadline, or at shutdown.

The store publishes from another thread (the learner's training, the relay's upstream pull);
each publish wakes, on the servicer's asyncio loop, every poll waiting on it.
"""

import asyncio
import contextlib

from apexrl.common.parameters import ParameterStore


class LongPolls:
    def __init__(self, store: ParameterStore):
        self.store = store
        self.stopping = False  # shutdown: polls answer at once
        self.waiting = 0  # polls waiting now
        # Polls wait on this event; each publish sets it and puts a fresh one in place.
        self._published: asyncio.Event | None = None

    def _next_publish(self) -> asyncio.Event:
        """The event the next publish sets (made, and hooked to the store, on first use)."""
        if self._published is None:
            loop = asyncio.get_running_loop()
            self._published = asyncio.Event()

            def published() -> None:  # in the publishing thread
                with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits
                    loop.call_soon_threadsafe(self._wake)

            self.store.on_publish(published)
        return self._published

    def _wake(self) -> None:
        if self._published is not None:
            self._published.set()
            self._published = asyncio.Event()

    def stop(self) -> None:
        """Shutdown: waiting polls answer now, and new ones do not wait."""
        self.stopping = True
        self._wake()

    async def wait_for_newer(self, version: int, lineage: int, wait: float, context) -> None:
        """Returns when a version newer than the one held is published (at once if it is not
        the newest), after `wait` seconds, just before the caller's deadline, or at shutdown."""
        if self.stopping:
            return
        # Taken before the check: a publish after the check sets this very event (both run on
        # this loop), so no wake-up is lost.
        published = self._next_publish()
        if not self.store.holds(version, lineage):
            return
        remaining = context.time_remaining()
        if remaining is not None:
            wait = min(wait, max(0.0, remaining - 0.05))
        self.waiting += 1
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(published.wait(), wait)
        finally:
            self.waiting -= 1
