"""Files that other nodes read while this one writes them (a shared filesystem)."""

from __future__ import annotations

import os
from pathlib import Path


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write ``data`` to a temporary name beside ``path``, then rename it over ``path``: a reader on
    another node sees the old file or the new one, never half of one. Text is written as UTF-8."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    os.replace(tmp, path)
