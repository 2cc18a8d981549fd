"""Split work over every process of every node without a process group: by rank, through files.

Stages 1 and 3 are CPU-parallel and need no collective ops, so each process gets a global rank
(``node_rank * nj + i`` of ``nnodes * nj``), takes its fixed slice of the shards, and marks each
finished shard with a ``.done`` file on the shared filesystem; node 0 waits for all of them.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)


def num_shards(n_items: int, shard_size: int) -> int:
    """How many shards of ``shard_size`` items hold ``n_items``."""
    return (n_items + shard_size - 1) // shard_size


def my_shards(n_shards: int, rank: int, world_size: int) -> list[int]:
    """Shards of this rank: every ``world_size``-th one from ``rank`` (round robin keeps it balanced)."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in 0..{world_size - 1}")
    return list(range(rank, n_shards, world_size))


def wait_for_shards(done: Callable[[int], bool], n_shards: int, world_size: int, what: str,
                    timeout: float, poll: float = 2.0) -> None:
    """Block until ``done(i)`` holds for every shard; on timeout name the missing shards and ranks."""
    start = last_log = time.monotonic()
    while True:
        missing = [i for i in range(n_shards) if not done(i)]
        if not missing:
            return
        now = time.monotonic()
        ranks = sorted({i % world_size for i in missing})
        if now - start > timeout:
            raise TimeoutError(
                f"{what}: after {timeout:.0f}s, {len(missing)} of {n_shards} shards are not done "
                f"(shards {missing[:10]}{'...' if len(missing) > 10 else ''}, owned by ranks {ranks[:10]}). "
                "Did every node run the same command with the same --nj, on a shared filesystem? "
                "Their logs say why a rank stopped.")
        if now - last_log > 60:
            last_log = now
            log.info("%s: waiting for %d of %d shards (ranks %s)", what, len(missing), n_shards, ranks[:10])
        time.sleep(poll)


def marker_matches(path: Path, fingerprint: str) -> bool:
    """True if ``path`` exists and its first line is ``fingerprint`` (a finished, current piece of work)."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.readline().strip() == fingerprint
    except FileNotFoundError:
        return False


def files_fingerprint(paths: list[Path], *extra: object) -> str:
    """A short hash of the files' paths, sizes and mtimes and of ``extra``: what a finished piece of
    work was made from (cheap for large weights: the contents are not read)."""
    h = hashlib.sha256()
    for path in paths:
        st = path.stat()
        h.update(f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    h.update(repr(extra).encode())
    return h.hexdigest()[:16]
