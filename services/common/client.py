"""What every apexrl gRPC client shares: one channel with explicit limits and fast
reconnects, deadlines on every call, and retries while the server is UNAVAILABLE."""

from collections.abc import Callable
from typing import Self, TypeVar

import grpc

from apexrl.common.backoff import RECONNECT_OPTIONS, retry_unavailable
from apexrl.common.serving import message_options

T = TypeVar("T")


class GrpcClient:
    def __init__(
        self,
        address: str,
        *,
        timeout: float,
        retry_seconds: float | None,
        max_message_mb: int = 512,
    ):
        """timeout: deadline of each call, seconds; retry_seconds: how long to retry while the
        server is UNAVAILABLE (None: forever)."""
        self.address, self.timeout, self.retry_seconds = address, timeout, retry_seconds
        self.channel = grpc.insecure_channel(
            address, options=message_options(max_message_mb) + RECONNECT_OPTIONS
        )

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _retry(self, call: Callable[[], T], what: str) -> T:
        return retry_unavailable(call, f"{self.address} {what}", self.retry_seconds)
