"""How relays find a loop among themselves: every pull a relay makes upstream carries, as gRPC
metadata, its own random id and the ids of the relays that pulled from it lately. A relay that
finds its own id in a caller's path is upstream of itself: it refuses the call (FAILED_PRECONDITION
naming the loop) and stops, and so does the relay whose pull was refused. A relay pointed at
itself finds its id in its own first pull; a loop of k relays within a pull or two of each."""

import secrets
import threading
import time

PATH_KEY = "apexrl-relay-path"
LOOP = "relay loop"  # in the status message of a refused pull
REMEMBER_SECONDS = 60.0  # a downstream relay silent this long has gone


class RelayPath:
    def __init__(self) -> None:
        self.relay_id = secrets.token_hex(8)
        self._downstream: dict[str, float] = {}  # relay id -> when last seen in a path
        self._lock = threading.Lock()

    def upstream(self) -> str:
        """What this relay's pulls carry: itself and the relays downstream of it."""
        now = time.monotonic()
        with self._lock:
            for relay, seen in list(self._downstream.items()):
                if now - seen > REMEMBER_SECONDS:
                    del self._downstream[relay]
            return ",".join([self.relay_id, *self._downstream])

    def arrived(self, metadata) -> bool:
        """Notes the relays on a caller's path; False when this relay is one of them (a loop)."""
        path = next((v for k, v in metadata or () if k == PATH_KEY), "")
        relays = [r for r in path.split(",") if r]
        if self.relay_id in relays:
            return False
        now = time.monotonic()
        with self._lock:
            for relay in relays:
                self._downstream[relay] = now
        return True
