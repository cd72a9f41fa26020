"""Priority write-back: the learner's new priorities sent to the replay from threads of their
own, coalesced and with several calls in flight, so the update step never waits on them."""

import logging
import queue
import threading
import time
from collections.abc import Callable

import numpy as np

log = logging.getLogger(__name__)

COALESCE = 16  # at most this many updates' priorities go to replay in one call
SENDERS = 4  # at most this many priority calls in flight at once


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
