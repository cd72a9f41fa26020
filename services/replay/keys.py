"""Item keys: (shard << 48) | sequence (replay.proto documents them).

An unsharded replay is shard 0, so its keys are the plain insertion sequence numbers.
"""

import re
import socket

import numpy as np

SHARD_SHIFT = 48
MAX_SHARD = (1 << 15) - 1  # bits 48-62: keys stay non-negative int64
SEQUENCE_MASK = (1 << SHARD_SHIFT) - 1


def shard_of(keys: np.ndarray) -> np.ndarray:
    return np.asarray(keys, np.int64) >> SHARD_SHIFT


def with_shard(sequences: np.ndarray, shard: int) -> np.ndarray:
    return np.asarray(sequences, np.int64) | np.int64(shard << SHARD_SHIFT)


def parse_shard(value: str, hostname: str | None = None) -> int:
    """The `shard` setting: an id, or 'hostname' = the ordinal ending the host name."""
    text = str(value).strip()
    if text == "hostname":
        hostname = hostname or socket.gethostname()
        match = re.search(r"-(\d+)$", hostname.split(".")[0])
        if match is None:
            raise ValueError(f"shard: host name {hostname!r} does not end in -<ordinal>")
        text = match.group(1)
    try:
        shard = int(text)
    except ValueError:
        raise ValueError(f"shard: {value!r} is neither an integer nor 'hostname'") from None
    if not 0 <= shard <= MAX_SHARD:
        raise ValueError(f"shard: {shard} is outside 0..{MAX_SHARD}")
    return shard
