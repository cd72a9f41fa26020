"""The relay's Prometheus metrics."""

import threading
import time

import prometheus_client

PULL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
CLIENT_SECONDS = 60.0  # a caller counts as a client this long after its last call


class RelayMetrics:
    def __init__(self, registry: prometheus_client.CollectorRegistry):
        def metric(kind, name, doc, **kw):
            return kind(f"apexrl_relay_{name}", doc, registry=registry, **kw)

        C, G, H = prometheus_client.Counter, prometheus_client.Gauge, prometheus_client.Histogram
        self.versions_pulled = metric(C, "versions_pulled", "Versions pulled from upstream.")
        self.version = metric(G, "parameter_version", "Newest version held (and served).")
        self.pull_seconds = metric(
            H,
            "pull_seconds",
            "Upstream GetParameters calls that brought a version, sent to decoded (change sets"
            " applied); a long poll's includes its wait for upstream's next version.",
            buckets=PULL_BUCKETS,
        )
        self.pull_failures = metric(C, "pull_failures", "Upstream pulls that failed.")
        self.bytes_served = metric(
            C, "parameter_bytes_served", "Bytes of the GetParameters answers sent to callers."
        )
        self.answers = metric(C, "answers", "GetParameters answers sent to callers.")
        self.clients = metric(
            G, "clients", f"Callers (actor ids, else peers) seen in the last {CLIENT_SECONDS:g} s."
        )
        self._seen: dict[str, float] = {}
        self._lock = threading.Lock()
        self.clients.set_function(self._count_clients)

    def client(self, caller: str) -> None:
        with self._lock:
            self._seen[caller] = time.monotonic()

    def _count_clients(self) -> int:
        now = time.monotonic()
        with self._lock:
            for caller, seen in list(self._seen.items()):
                if now - seen > CLIENT_SECONDS:
                    del self._seen[caller]
            return len(self._seen)
