"""Several hosts on one machine: network namespaces joined by a veth pair, nftables partitions.

Everything lives in namespaces this module creates (unique names per run, always deleted):
the test process itself stays in the host namespace and reaches the services only through
a worker thread that has entered the namespace (setns is per thread for network namespaces),
so no private address is ever used from the host namespace.
"""

import ctypes
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import TypeVar

from tests import conftest
from tests.conftest import require_root_feature

T = TypeVar("T")
CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def unavailable_reason() -> str | None:
    """Why namespaces with nftables cannot be used here (None: they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    missing = [tool for tool in ("ip", "nft") if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not installed (apt-get install iproute2 nftables)"
    name = f"apexrl-probe-{os.getpid()}"
    probe = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"ip netns add failed: {probe.stderr.strip()}"
    try:
        nft = _run(["ip", "netns", "exec", name, "nft", "list", "ruleset"], check=False)
        if nft.returncode != 0:
            return f"nft unusable in a namespace: {nft.stderr.strip()}"
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None


def require_netns() -> None:
    """Skips the test without namespaces, or fails it under APEXRL_REQUIRE_ROOT=1 (CI)."""
    require_root_feature(unavailable_reason())


def _run(args: list[str], check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(args, capture_output=True, text=True, timeout=30, **kwargs)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({result.returncode}): {result.stderr}")
    return result


class NetNS:
    """One network namespace: runs commands, processes and Python calls inside it."""

    def __init__(self, name: str):
        self.name = name
        _run(["ip", "netns", "add", name])
        self._executor: ThreadPoolExecutor | None = None
        try:
            self.ip("link", "set", "lo", "up")
            path = f"/run/netns/{name}"
            self._executor = ThreadPoolExecutor(1, f"netns-{name}", self._enter, (path,))
            self.call(lambda: None)  # surfaces a failed setns now
        except BaseException:
            self.delete()
            raise

    @staticmethod
    def _enter(path: str) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            if _libc.setns(fd, CLONE_NEWNET) != 0:
                errno = ctypes.get_errno()
                raise OSError(errno, f"setns({path}): {os.strerror(errno)}")
        finally:
            os.close(fd)

    @property
    def prefix(self) -> tuple[str, ...]:
        """Prepended to a command line, runs it inside the namespace."""
        return ("ip", "netns", "exec", self.name)

    def ip(self, *args: str) -> None:
        _run(["ip", "-n", self.name, *args])

    def sh(self, *args: str, input: str | None = None, check: bool = True) -> str:
        return _run([*self.prefix, *args], check=check, input=input).stdout

    def call(self, fn: Callable[[], T], timeout: float = 30) -> T:
        """Runs fn in a thread inside the namespace (sockets it opens live there)."""
        assert self._executor is not None
        return self._executor.submit(fn).result(timeout)

    def delete(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, timeout=30)


@dataclass
class Link:
    """Two namespaces joined by a veth pair: `a` has address `a_addr`, `b` has `b_addr`."""

    a: NetNS
    b: NetNS
    a_addr: str
    b_addr: str


@contextmanager
def linked_namespaces(a: str, b: str, subnet: str = "10.213.7") -> Iterator[Link]:
    """Namespaces `<a>-<pid>` and `<b>-<pid>` joined by a /30 veth link; deleted afterwards.

    The veth ends are created directly inside the namespaces: nothing touches the host's.
    """
    suffix = f"{os.getpid()}-{time.monotonic_ns() % 10**6}"
    with ExitStack() as stack:
        ns_a = NetNS(f"apexrl-{a}-{suffix}")
        stack.callback(ns_a.delete)
        ns_b = NetNS(f"apexrl-{b}-{suffix}")
        stack.callback(ns_b.delete)
        _run(["ip", "link", "add", "name", "eth0", "netns", ns_a.name, "type", "veth",
              "peer", "name", "eth0", "netns", ns_b.name])  # fmt: skip
        link = Link(ns_a, ns_b, f"{subnet}.1", f"{subnet}.2")
        for ns, addr in ((ns_a, link.a_addr), (ns_b, link.b_addr)):
            ns.ip("addr", "add", f"{addr}/30", "dev", "eth0")
            ns.ip("link", "set", "eth0", "up")
        yield link


PARTITION_TABLE = "apexrl_partition"


def partition(ns: NetNS, peer: str) -> None:
    """Silently drops every packet arriving in `ns` from `peer` (senders see no error)."""
    ns.sh("nft", "-f", "-", input=f"""
table inet {PARTITION_TABLE} {{
    chain input {{
        type filter hook input priority filter; policy accept;
        ip saddr {peer} counter drop
    }}
}}
""")  # fmt: skip


def dropped_packets(ns: NetNS) -> int:
    """Packets the partition rule in `ns` has dropped so far."""
    text = ns.sh("nft", "list", "table", "inet", PARTITION_TABLE)
    counts = [int(line.split("packets")[1].split()[0]) for line in text.splitlines()
              if "packets" in line]  # fmt: skip
    if not counts:  # a rule without `counter` would read as "nothing dropped"
        raise RuntimeError(f"no counter in {PARTITION_TABLE} of {ns.name}:\n{text}")
    return sum(counts)


def heal(ns: NetNS) -> None:
    ns.sh("nft", "delete", "table", "inet", PARTITION_TABLE, check=False)


def metrics(ns: NetNS, host: str, port: int) -> dict[str, float]:
    """A service's Prometheus metrics (label sets summed), fetched from inside `ns`."""
    return ns.call(lambda: conftest.metrics(port, host))
