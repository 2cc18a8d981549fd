"""Files that other nodes read while this one writes them (a shared filesystem), and file digests."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

BLOCK = 1 << 20  # read in 1 MiB blocks: shards and checkpoints can be larger than memory allows twice


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write ``data`` to a temporary name beside ``path``, then rename it over ``path``: a reader on
    another node sees the old file or the new one, never half of one. Text is written as UTF-8."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    os.replace(tmp, path)


def feed_file(h: hashlib._Hash, path: Path) -> None:
    """Update the running hash ``h`` with the bytes of ``path`` (FileNotFoundError when it is absent)."""
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(BLOCK), b""):
            h.update(block)


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's bytes."""
    h = hashlib.sha256()
    feed_file(h, path)
    return h.hexdigest()
