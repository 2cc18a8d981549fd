"""``.done`` markers and the fingerprints in them: the one marker system of bash (run.sh, through
``python -m local.marker``) and Python (stage programs, shards) alike.

A marker is a small text file: line 1 the fingerprint of what produced the work, line 2 when and where
it was written, line 3 (optional) a JSON summary of the work. Work is current when its marker's first
line equals the fingerprint of today's inputs: a rerun with other inputs redoes it, and a node waiting
for node 0 does not take an old run's marker for this one's. Markers are written to a temporary name
and renamed, so a reader on another node sees no marker or a whole one, never half.

A fingerprint is the first 16 hex digits of a sha256 over
  - ``parts``: strings (options, names, other fingerprints), each ended by a newline;
  - ``files``: each file's resolved path, size and modification time (cheap for large weights: the
    contents are not read);
  - ``contents``: each file's bytes (for the small tables a user edits in place), or "absent".

  fp = fingerprint("stage 2", config_name, files=[Path("exp/x/final/model.pt")])
  if not is_done(out / ".done", fp): ...; mark_done(out / ".done", fp, {"utterances": 500})
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from funasr_recipe.core.files import feed_file, write_atomic

log = logging.getLogger(__name__)
LOG_EVERY_S = 60.0


def fingerprint(*parts: object, files: Iterable[Path] = (), contents: Iterable[Path] = ()) -> str:
    """The fingerprint of ``parts``, ``files`` (by stat) and ``contents`` (by bytes); module docstring."""
    h = hashlib.sha256()
    for part in parts:
        h.update(f"{part}\n".encode())
    for path in map(Path, files):
        st = path.stat()
        h.update(f"file {path.resolve()}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    for path in map(Path, contents):
        h.update(f"content {path.name}\n".encode())
        try:
            feed_file(h, path)
        except FileNotFoundError:
            h.update(b"absent\n")
    return h.hexdigest()[:16]


def read_fingerprint(path: Path) -> str | None:
    """The fingerprint a marker holds, or None when there is no marker."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.readline().strip()
    except FileNotFoundError:
        return None


def is_done(path: Path, fp: str) -> bool:
    """True if the marker at ``path`` exists and holds ``fp``: the work is finished and current."""
    return read_fingerprint(path) == fp


def mark_done(path: Path, fp: str, info: dict | None = None) -> None:
    """Write the marker of finished work (atomically); ``info`` is kept as its JSON third line."""
    path = Path(path)
    stamp = f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {socket.gethostname()} node{os.environ.get('NODE_RANK', 0)}"
    write_atomic(path, f"{fp}\n{stamp}\n" + ("" if info is None else json.dumps(info) + "\n"))


def marker_info(path: Path) -> dict:
    """The JSON summary a marker was written with ({} without one)."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return json.loads(lines[2]) if len(lines) > 2 else {}


class WaitTimeout(TimeoutError):
    """A wait ran out of time; the message names what was still missing and what to check."""


def listed(items: list[str], most: int = 10) -> str:
    """The first ``most`` items, comma separated, and "..." when there are more."""
    return ", ".join(items[:most]) + (", ..." if len(items) > most else "")


def wait_until(missing: Callable[[], list[str]], what: str, timeout: float,
               timeout_message: Callable[[list[str]], str], poll: float = 2.0) -> None:
    """Block until ``missing()`` is empty; log what is still missing at once and then every minute, and on
    timeout raise WaitTimeout with ``timeout_message(what is still missing)``: what, and what to check."""
    start = time.monotonic()
    last_log = start - LOG_EVERY_S
    while True:
        left = missing()
        if not left:
            return
        now = time.monotonic()
        if now - start >= timeout:
            raise WaitTimeout(timeout_message(left))
        if now - last_log >= LOG_EVERY_S:
            last_log = now
            log.info("%s (%.0fs of %.0fs): %s", what, now - start, timeout, listed(left))
        time.sleep(poll)


def wait_for_shards(done: Callable[[int], bool], n_shards: int, world_size: int, what: str,
                    timeout: float, poll: float = 2.0) -> None:
    """Block until ``done(i)`` holds for every shard; on timeout name the missing shards and their ranks."""
    def missing() -> list[str]:
        return [f"shard {i} (rank {i % world_size})" for i in range(n_shards) if not done(i)]

    def message(left: list[str]) -> str:
        return (f"{what}: after {timeout:.0f}s still waiting for {listed(left)}. Did every node run the same "
                "command with the same --nj, on a shared filesystem? Their logs say why a rank stopped.")

    wait_until(missing, what, timeout, message, poll)


def wait_for_marker(path: Path, fp: str, what: str, timeout: float, poll: float = 5.0) -> None:
    """Block until node 0's marker at ``path`` holds ``fp``; a marker with another fingerprint (an earlier
    run, or node 0 started with other options) is said once a minute while waiting."""
    def missing() -> list[str]:
        if is_done(path, fp):
            return []
        found = read_fingerprint(path)
        return [f"{path} with fingerprint {fp}" + ("" if found is None else
                f" (it holds {found}: an earlier run, or node 0 was started with other options)")]

    def message(left: list[str]) -> str:
        return (f"waited {timeout:.0f}s for node 0 to finish {what} ({left[0]}). Is node 0 running the same "
                f"command, and is {Path(path).parent} on a filesystem all nodes share?")

    wait_until(missing, f"waiting for node 0 to finish {what}", timeout, message, poll)
