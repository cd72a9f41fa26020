"""Actor leases: which actors are alive, in the order they arrived (learner.proto explains)."""

import threading


class Leases:
    """Which actors are alive, in the order they arrived: their places in the epsilon ladder."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self._began: dict[str, float] = {}
        self._seen: dict[str, float] = {}
        self._lock = threading.Lock()

    def renew(self, actor_id: str, now: float) -> tuple[int, int]:
        """Renews (or starts) a lease; returns (index, number of live actors)."""
        with self._lock:
            for other, seen in list(self._seen.items()):
                if now - seen > self.seconds:
                    del self._seen[other], self._began[other]
            self._began.setdefault(actor_id, now)
            self._seen[actor_id] = now
            order = sorted(self._began, key=lambda a: (self._began[a], a))
            return order.index(actor_id), len(order)
