"""Shards: the replay shards behind one `replay` setting, which of them answer, and each one's
mass and size as last seen. ShardedReplayClient (sharded.py) does the replay verbs over them.

Addresses: "h0:p,h1:p,..." are shards 0, 1, ... in that order (a shard that answers with
another id is an error naming it); "dns:///name:port" makes every address the name resolves
to a shard (a Kubernetes headless Service: only ready pods resolve), re-resolved every
RESOLVE_SECONDS, so shards that are added are picked up. Every shard's table must have the
same alpha and signature.

A shard's view (its sum of p^alpha and size) is refreshed from its Info when older than
VIEW_SECONDS, and from every response that carries it. A shard the caller finds down is asked
again every RETRY_SECONDS; it rejoins when it answers (restarted from its checkpoint, its keys
are valid again).
"""

import logging
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import grpc

from apexrl.replay.client import ReplayClient
from apexrl.v1 import replay_pb2, tensor_pb2

log = logging.getLogger(__name__)
T = TypeVar("T")

DNS_PREFIX = "dns:///"


class ShardError(ValueError):
    """A shard set that cannot work: a wrong shard id, different tables, a key of no shard."""


@dataclass
class Shard:
    id: int
    address: str
    client: ReplayClient
    total: float = 0.0  # sum of p^alpha, as last seen
    size: int = 0
    seen: float = 0.0  # monotonic time of the view
    alive: bool = True
    retry_at: float = 0.0

    def note(self, total: float, size: int) -> None:
        """The shard's mass and size, as seen now."""
        self.total, self.size, self.seen = total, size, time.monotonic()


class Shards:
    VIEW_SECONDS = 1.0
    RETRY_SECONDS = 1.0
    RESOLVE_SECONDS = 5.0

    def __init__(self, address: str, *, table: str, timeout: float, options: dict):
        """options: the ReplayClient options every shard's client takes."""
        self.address, self.table, self.timeout = address, table, timeout
        self._options = options
        self._dns = address.startswith(DNS_PREFIX)
        self._listed = [] if self._dns else [a.strip() for a in address.split(",")]
        if not self._dns and not all(self._listed):
            raise ValueError(f"replay: empty shard address in {address!r}")
        self._shards: dict[int, Shard] = {}  # by shard id
        self._clients: dict[str, ReplayClient] = {}  # by address, for shards not yet known
        self._lock = threading.Lock()
        self._discovered = 0.0
        self._pool = ThreadPoolExecutor(16, thread_name_prefix="shards")
        self._reference: replay_pb2.TableInfo | None = None  # the table every shard must match

    def _addresses(self) -> list[str]:
        if not self._dns:
            return self._listed
        host, _, port = self.address[len(DNS_PREFIX) :].rpartition(":")
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except socket.gaierror as err:
            log.warning("replay: cannot resolve %s: %s", host, err)
            return [s.address for s in self.known()]
        ips = sorted({str(info[4][0]) for info in infos})  # an IP: a str for AF_INET(6)
        return [f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}" for ip in ips]

    def discover(self, force: bool = False) -> None:
        """Asks every address that is not a live shard yet for its Info (in parallel)."""
        now = time.monotonic()
        if not force and now - self._discovered < self.RESOLVE_SECONDS:
            return
        self._discovered = now
        addresses = self._addresses()
        live = {s.address for s in self.known() if s.alive}
        asked = [a for a in addresses if a not in live]
        position_of = {a: i for i, a in enumerate(addresses)}
        for position, info, address in zip(
            [position_of[a] for a in asked],
            self.map(lambda a: self.table_info(self._client(a)), asked),
            asked,
            strict=True,
        ):
            if isinstance(info, BaseException):
                continue  # down: asked again at the next discovery
            self._join(address, position, *info)

    def _client(self, address: str) -> ReplayClient:
        with self._lock:
            if address not in self._clients:
                # A shard found through a name is dialled by IP; TLS still checks the name.
                name = self.address[len(DNS_PREFIX) :].rpartition(":")[0] if self._dns else ""
                options = dict(self._options)
                channel = tuple(options.pop("channel_options", ()))
                if name:
                    channel += (("grpc.ssl_target_name_override", name),)
                self._clients[address] = ReplayClient(
                    address,
                    table=self.table,
                    timeout=self.timeout,
                    retry_seconds=0,
                    channel_options=channel,
                    **options,
                )
            return self._clients[address]

    def table_info(self, client: ReplayClient) -> tuple[int, replay_pb2.TableInfo]:
        """The shard id a replay answers as, and its table."""
        response = client.stub.Info(replay_pb2.InfoRequest(), timeout=min(self.timeout, 5.0))
        for table in response.tables:
            if table.name == self.table:
                return response.shard, table
        raise ShardError(f"replay shard at {client.address} has no table {self.table!r}")

    def _join(self, address: str, position: int, shard_id: int, info) -> None:
        if not self._dns and shard_id != position:
            raise ShardError(
                f"replay shard {position} ({address}) answers as shard {shard_id}: "
                f"list the shards in order of their shard setting"
            )
        with self._lock:
            other = self._shards.get(shard_id)
            if other is not None and other.alive and other.address != address:
                raise ShardError(
                    f"replay shard {shard_id}: both {other.address} and {address} answer as it"
                )
            self._check_table(shard_id, address, info)
            shard = Shard(shard_id, address, self._clients[address])
            shard.note(info.total_priority, info.size)
            if other is not None and other.address != address:
                log.info("replay shard %d moved from %s to %s", shard_id, other.address, address)
            elif other is None:
                log.info("replay shard %d joined at %s (%d items)", shard_id, address, info.size)
            else:
                log.info("replay shard %d is back (%d items)", shard_id, info.size)
            self._shards[shard_id] = shard

    def _check_table(self, shard_id: int, address: str, info: replay_pb2.TableInfo) -> None:
        reference = self._reference
        if reference is not None:
            if info.alpha != reference.alpha:
                raise ShardError(
                    f"replay shard {shard_id} ({address}): table {self.table!r} has alpha "
                    f"{info.alpha}, the other shards {reference.alpha}"
                )
            if info.signature and reference.signature and _signature(info) != _signature(reference):
                raise ShardError(
                    f"replay shard {shard_id} ({address}): table {self.table!r} has signature "
                    f"{_signature(info)}, the other shards {_signature(reference)}"
                )
        if reference is None or (info.signature and not reference.signature):
            self._reference = info

    def down(self, shard: Shard, err: grpc.RpcError) -> None:
        """Leaves the shard out until it answers again (asked every RETRY_SECONDS)."""
        with self._lock:
            if shard.alive:
                log.warning(
                    "replay shard %d (%s) is down: %s", shard.id, shard.address, _short(err)
                )
            shard.alive, shard.retry_at = False, time.monotonic() + self.RETRY_SECONDS

    def live(self) -> list[Shard]:
        """The live shards, after asking the ones that are due (down ones, stale views)."""
        self.discover()
        now = time.monotonic()
        due = [
            s
            for s in self.known()
            if s.retry_at <= now and (not s.alive or now - s.seen > self.VIEW_SECONDS)
        ]
        for shard, info in zip(
            due, self.map(lambda s: self.table_info(s.client), due), strict=True
        ):
            if isinstance(info, grpc.RpcError):
                self.down(shard, info)
            elif isinstance(info, BaseException):
                raise info
            elif info[0] != shard.id:
                raise ShardError(
                    f"replay shard {shard.id} ({shard.address}) now answers as shard {info[0]}"
                )
            else:
                with self._lock:
                    self._check_table(shard.id, shard.address, info[1])
                    was_down, shard.alive = not shard.alive, True
                shard.note(info[1].total_priority, info[1].size)
                if was_down:
                    log.info("replay shard %d (%s) is back", shard.id, shard.address)
        return sorted((s for s in self.known() if s.alive), key=lambda s: s.id)

    def known(self) -> list[Shard]:
        """Every shard that has joined, live or down."""
        with self._lock:
            return list(self._shards.values())

    def map(self, call: Callable[..., T], items: list) -> list[T | BaseException]:
        """call(item) for every item, in parallel (the first in this thread); errors returned."""

        def safe(item):
            try:
                return call(item)
            except Exception as err:
                return err

        futures = [self._pool.submit(safe, item) for item in items[1:]]
        return ([safe(items[0])] if items else []) + [f.result() for f in futures]

    def close(self) -> None:
        with self._lock:
            clients = list(self._clients.values())
        for client in clients:
            client.close()
        self._pool.shutdown(wait=False, cancel_futures=True)


def _signature(info: replay_pb2.TableInfo) -> str:
    """The columns in name order (a signature fixed by a first insert has its dict's order)."""
    columns = sorted(info.signature, key=lambda c: c.name)
    return ",".join(
        f"{c.name}:{tensor_pb2.DType.Name(c.dtype).lower()}:{list(c.shape)}"
        + (f":{tensor_pb2.Codec.Name(c.codec).lower()}" if c.codec else "")
        for c in columns
    )


def _short(err: grpc.RpcError) -> str:
    return f"{err.code().name}: {err.details()}" if hasattr(err, "details") else str(err)
