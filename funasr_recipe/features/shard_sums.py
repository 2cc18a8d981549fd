"""Checksums of stage 1's shards: recorded when a shard is written, checked before it is trusted or read.

A shard's data files (``SHARD_FILES``: the .ark that training reads, and the .scp, .jsonl, .rejected.tsv and
.stats.npz that the merge reads) are described in the JSON summary of its ``.done`` marker (dist/markers.py,
line 3) under ``"files"``: ``{suffix: {"bytes": size, "crc32": 8 hex digits}}``. The record lives in the
marker, written after the files: a shard without its marker has no record, and removing a marker (repair)
is what makes stage 1 compute that shard again.

crc32 because it is the fastest good check at hand (bench/bench_shard_sums.py: 3.9 GB/s a core here, against
1.6 for sha1 and 0.8 for blake2b; reading the file from the page cache costs about as much again) and the
one data/local_cache.py already checks its copies with, so that a copy is checked against stage 1's own
record. It finds every burst of up to 32 flipped bits and all but one in 2^32 other corruptions; the size,
compared before anything is read, finds a truncation at once. It is a guard against accidents (a bad disk,
a truncated copy, a half-synced filesystem), not against a forged shard.

Reads  <dump>/<set>/shards/NNNNN.{done,ark,scp,jsonl,rejected.tsv,stats.npz} (and, for ``verify_sets``,
       <dump>/<set>/data.jsonl, whose sources name the shards);
writes nothing but, on repair, removes the markers of the shards that fail, the merged lists of their sets
       (``MERGED``) and <dump>/.done, so that the next stage-1 run recomputes exactly those shards.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
import zlib
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from funasr_recipe.core.cli import StageFailed
from funasr_recipe.core.jsonl import iter_jsonl
from funasr_recipe.core.log import Progress
from funasr_recipe.core.rejections import BadInputError
from funasr_recipe.dist.markers import marker_info

log = logging.getLogger(__name__)

SHARD_FILES = ("ark", "scp", "jsonl", "rejected.tsv", "stats.npz")
RECORD = "files"  # the key of the marker's summary that holds the record
MERGED = ("data.jsonl", "feats.scp", "rejected.tsv", "report.json")  # a set's files made from its shards
CHUNK = 8 << 20  # large reads: few syscalls, and zlib.crc32 releases the GIL (threads hash in parallel)
ADVICE = "rerun stage 1: it recomputes these shards"
THREADS = min(8, os.cpu_count() or 1)
# kaldiio's "<path>:<offset>" and "<path>:<offset>[<slice>]" (data/local_cache.py reads them the same way).
_SOURCE = re.compile(r"^(?P<path>.+?)(?::\d+(?:\[[^\]]*\])?)?$")


def file_sum(path: Path, on_bytes: Callable[[int], None] | None = None) -> dict:
    """``{"bytes": size, "crc32": hex}`` of a file's bytes, read in ``CHUNK`` blocks into one buffer."""
    crc, size = 0, 0
    view = memoryview(bytearray(CHUNK))
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(view):
            crc = zlib.crc32(view[:n], crc)
            size += n
            if on_bytes is not None:
                on_bytes(n)
    return {"bytes": size, "crc32": f"{crc:08x}"}


def data_file(marker: Path, suffix: str) -> Path:
    """``.../00003.done``, ``"ark"`` -> ``.../00003.ark``."""
    return marker.with_name(f"{marker.name.split('.', 1)[0]}.{suffix}")


def record(marker: Path) -> dict[str, dict]:
    """The record of the shard whose marker will be ``marker``: every data file's size and crc32; made
    right after the files are written (they are still in the page cache: reading them back is cheap)."""
    return {suffix: file_sum(data_file(marker, suffix)) for suffix in SHARD_FILES}


def recorded_sum(path: Path) -> dict | None:
    """What the marker beside a shard's data file (``.../00003.ark``) records of it, or None (no marker, no
    record: not a stage-1 shard, or one of an older version)."""
    path = Path(path)
    stem, _, suffix = path.name.partition(".")
    try:
        return (marker_info(path.with_name(f"{stem}.done")).get(RECORD) or {}).get(suffix)
    except (OSError, ValueError):
        return None


@dataclass
class ShardCheck:
    """What one shard's check found: nothing (it matches), mismatches, or why it cannot be checked."""

    marker: Path
    problems: list[str] = field(default_factory=list)
    unverifiable: bool = False  # no record to check against: it must be recomputed all the same

    def line(self) -> str:
        """One line naming the shard and, per file, what was expected and what was found."""
        kind = "cannot be checked" if self.unverifiable else "does not match its record"
        return f"shard {self.marker.with_suffix('')} {kind}: " + "; ".join(self.problems)


def _shard_record(marker: Path) -> dict | None:
    try:
        files = marker_info(marker).get(RECORD)
    except (OSError, ValueError):
        return None
    return files if isinstance(files, dict) else None


def check_shard(marker: Path, on_bytes: Callable[[int], None] | None = None) -> ShardCheck:
    """Check a shard's data files against its marker's record: sizes first (no reads), then crc32."""
    check = ShardCheck(marker)
    if not marker.is_file():
        check.unverifiable = True
        check.problems.append(f"{marker}: no .done marker (not a finished stage-1 shard)")
        return check
    files = _shard_record(marker)
    if files is None:
        check.unverifiable = True
        check.problems.append(f"{marker}: no checksum recorded (made by an older version of stage 1)")
        return check
    for suffix, want in files.items():
        path = data_file(marker, suffix)
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            check.problems.append(f"{path}: missing ({want['bytes']} bytes expected)")
            continue
        if size != want["bytes"]:
            check.problems.append(f"{path}: size {want['bytes']} bytes expected, {size} found")
            if on_bytes is not None:
                on_bytes(want["bytes"])  # counted as done: the progress total is the recorded sizes
            continue
        got = file_sum(path, on_bytes)
        if got != want:
            check.problems.append(f"{path}: crc32 {want['crc32']} expected, {got['crc32']} found"
                                  + ("" if got["bytes"] == size else " (it changed while read: is stage 1 "
                                                                       "running?)"))
    return check


def check_shards(markers: Iterable[Path], what: str, threads: int = THREADS,
                 interval: float = 10.0) -> list[ShardCheck]:
    """Check shards in ``threads`` parallel threads, with a progress line and a final rate; returns the
    ones that fail (mismatched or unverifiable), in the order given."""
    markers = list(markers)
    total = sum(sum(f.get("bytes", 0) for f in (_shard_record(m) or {}).values()) for m in markers)
    progress = Progress(f"{what}: checking {len(markers)} shards", -(-total >> 20), unit="MiB",
                        interval=interval, logger=log)
    lock, done = threading.Lock(), [0]

    def count(n: int) -> None:
        with lock:
            done[0] += n
            progress.update((done[0] >> 20) - progress.count)

    start = time.monotonic()
    with ThreadPoolExecutor(max(1, threads)) as pool:
        checks = list(pool.map(lambda m: check_shard(m, count), markers))
    progress.close()
    seconds = time.monotonic() - start
    bad = [c for c in checks if c.problems]
    log.info("%s: %d shards, %.1f MiB checked (crc32) in %.2f s (%.0f MB/s); %d fail", what, len(markers),
             done[0] / (1 << 20), seconds, done[0] / 1e6 / max(seconds, 1e-9), len(bad))
    return bad


def recheck(markers: Iterable[Path], what: str, threads: int = 1) -> set[Path]:
    """The markers (of shards that look finished) whose data fail their check, each logged as a warning:
    stage 1's resume recomputes them rather than certify them again."""
    markers = list(markers)
    if not markers:
        return set()
    bad = check_shards(markers, what, threads)
    for check in bad:
        log.warning("%s; recomputing it", check.line())
    return {c.marker for c in bad}


def remove_markers(bad: Iterable[ShardCheck]) -> None:
    """Remove the markers of failed shards: stage 1 then recomputes them (and waits for them to merge)."""
    for check in bad:
        check.marker.unlink(missing_ok=True)


def refuse_merge(name: str, bad: list[ShardCheck]) -> StageFailed:
    """The merge's error for shards that fail their check (their markers are removed first)."""
    remove_markers(bad)
    lines = "\n  ".join(c.line() for c in bad)
    return StageFailed(f"{name}: {len(bad)} shard(s) fail their check and are not merged:\n  {lines}\n"
                       f"their markers are removed; {ADVICE}")


def source_file(source: str) -> str:
    """``"/d/shards/00000.ark:24"`` -> ``"/d/shards/00000.ark"``."""
    m = _SOURCE.match(source)
    if m is None:
        raise BadInputError(f"empty source {source!r}")
    return m["path"]


def listed_shards(jsonl: Path) -> list[Path]:
    """The markers of the shards a merged list's sources name, in the order first named."""
    if not jsonl.is_file():
        raise FileNotFoundError(f"{jsonl} is missing: run stage 1 first")
    seen: dict[str, Path] = {}
    for lineno, obj in iter_jsonl(jsonl):
        source = obj.get("source")
        if not isinstance(source, str):
            raise BadInputError(f"{jsonl}:{lineno}: no 'source': not a stage-1 data.jsonl line")
        path = source_file(source)
        if path not in seen:
            p = Path(path)
            seen[path] = p.with_name(f"{p.name.split('.', 1)[0]}.done")
    return list(dict.fromkeys(seen.values()))


def verify_sets(dump_dir: Path, sets: Iterable[str], repair: bool,
                threads: int = THREADS) -> list[ShardCheck]:
    """Check every shard the sets' data.jsonl name; log one line per failing shard; with ``repair``, remove
    their markers, their sets' merged lists and <dump>/.done. Returns the failing shards."""
    owner: dict[Path, str] = {}
    for name in dict.fromkeys(sets):
        for marker in listed_shards(dump_dir / name / "data.jsonl"):
            owner.setdefault(marker, name)
    bad = check_shards(owner, f"{dump_dir}: verify", threads)
    for check in bad:
        log.error("%s", check.line())
    if bad and repair:
        remove_markers(bad)
        for name in sorted({owner[c.marker] for c in bad}):
            for merged in MERGED:
                (dump_dir / name / merged).unlink(missing_ok=True)
        (dump_dir / ".done").unlink(missing_ok=True)
        log.warning("repaired: removed %d shard marker(s), the merged lists of set(s) %s, and %s; the next "
                    "stage-1 run recomputes exactly those shards", len(bad),
                    " ".join(sorted({owner[c.marker] for c in bad})), dump_dir / ".done")
    return bad
