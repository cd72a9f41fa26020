"""Folders a command writes into, checked before it plays or trains anything."""

import tempfile
from pathlib import Path


def writable(folder: str, setting: str) -> Path:
    """`folder`, created; ValueError naming `setting` where it cannot be written (a file made
    and removed in it: root passes os.access on a read-only mount)."""
    path = Path(folder)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as err:
        raise ValueError(f"{setting}: cannot write to {folder} ({err.strerror or err})") from err
    return path
