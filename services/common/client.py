"""What every apexrl gRPC client shares: one channel with explicit limits, fast reconnects and
optional (mutual) TLS, deadlines on every call, retries while the server is away."""

import threading
from collections.abc import Callable
from typing import Self, TypeVar

import grpc

from apexrl.common.backoff import RECONNECT_OPTIONS, retry_unavailable
from apexrl.common.serving import message_options
from apexrl.config import ClientTLSConfig

T = TypeVar("T")


def channel_credentials(tls: ClientTLSConfig | None) -> grpc.ChannelCredentials | None:
    """TLS credentials from PEM files (None: plaintext); a client certificate makes it mutual."""
    if tls is None or not tls.tls_ca:
        return None
    if bool(tls.tls_client_cert) != bool(tls.tls_client_key):
        raise ValueError("tls_client_cert and tls_client_key: give both or neither")
    return grpc.ssl_channel_credentials(
        root_certificates=_read(tls.tls_ca),
        private_key=_read(tls.tls_client_key) if tls.tls_client_key else None,
        certificate_chain=_read(tls.tls_client_cert) if tls.tls_client_cert else None,
    )


def short_error(err: Exception) -> str:
    """A failed call's status message (its details), else the exception's text: one log line."""
    details = getattr(err, "details", None)
    return details() if callable(details) else str(err)


def _read(path: str) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


class GrpcClient:
    def __init__(
        self,
        address: str,
        *,
        timeout: float,
        retry_seconds: float | None = 60.0,
        retry_cap: float = 5.0,
        max_message_mb: int = 512,
        tls: ClientTLSConfig | None = None,
        channel_options: tuple = (),
        stop: threading.Event | None = None,
    ):
        """timeout: deadline of each call, seconds; retry_seconds: how long to retry while the
        server is UNAVAILABLE (None: forever), waiting up to retry_cap seconds between tries;
        tls: CA (and client certificate) files; channel_options: more gRPC channel arguments;
        stop: the process's stop, after which a call is tried once, not retried."""
        self.address, self.timeout, self.retry_seconds = address, timeout, retry_seconds
        self.retry_cap, self.stop = retry_cap, stop
        self.closed = False  # set by close(): the calls it cancels are the caller's own
        options = message_options(max_message_mb) + RECONNECT_OPTIONS + list(channel_options)
        credentials = channel_credentials(tls)
        self.channel = (
            grpc.insecure_channel(address, options=options)
            if credentials is None
            else grpc.secure_channel(address, credentials, options=options)
        )

    def close(self) -> None:
        self.closed = True
        self.channel.close()

    def stopping(self) -> bool:
        """The process's stop is set or this client was closed: a call cancelled now was
        cancelled by its own side, not by the server."""
        return self.closed or (self.stop is not None and self.stop.is_set())

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _retry(self, call: Callable[[], T], what: str) -> T:
        return retry_unavailable(
            call,
            f"{self.address} {what}",
            self.retry_seconds,
            self.retry_cap,
            self.stop,
            closed=lambda: self.closed,
        )
