"""The /metrics endpoint every process serves: plain HTTP, or TLS (optionally requiring
client certificates) when the process is given a certificate for it."""

import threading

import prometheus_client

from apexrl.config import ProcessConfig


def start_metrics_server(config: ProcessConfig, registry: prometheus_client.CollectorRegistry):
    """prometheus_client's HTTP server on config.metrics_port; returns (server, thread).

    With metrics_tls_cert and metrics_tls_key it speaks TLS only (a plaintext scrape gets no
    answer); with metrics_client_ca too, it also requires a client certificate that CA signed.
    """
    cert, key, client_ca = config.metrics_tls_cert, config.metrics_tls_key, config.metrics_client_ca
    if not (cert or key or client_ca):
        return prometheus_client.start_http_server(
            config.metrics_port, addr=config.host, registry=registry
        )
    if not (cert and key):
        raise ValueError(
            "metrics_tls_cert and metrics_tls_key: /metrics over TLS needs both"
            " (metrics_client_ca alone is not enough)"
        )
    return prometheus_client.start_http_server(
        config.metrics_port,
        addr=config.host,
        registry=registry,
        certfile=cert,
        keyfile=key,
        client_cafile=client_ca or None,
        client_auth_required=bool(client_ca),
    )


def stop_metrics_server(server) -> None:
    """Stops serving /metrics without waiting for it: socketserver's shutdown() blocks until
    the serving loop's next poll, up to half a second of every service's stop. It runs in a
    thread of its own instead; the loop ends at its next poll."""
    threading.Thread(target=server.shutdown, name="metrics-stop", daemon=True).start()
