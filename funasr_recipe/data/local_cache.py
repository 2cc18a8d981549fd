"""A node-local copy of the stage-1 features that stage 2 reads (run.sh --local-cache DIR).

Training reads every utterance's fbank from the shared dump/ each epoch; on a cluster that is NFS or
Lustre under all the nodes' DataLoader workers at once. ``fill`` copies the files the training lists name
to a node-local disk (NVMe, or /dev/shm) before training and hands back a dump dir that reads from there.

Which files: every file that the ``source`` of a line of <dump>/<set>/data.jsonl names (``<ark>:<offset>``),
for the sets given (training, validation, replay), all of them on every node: the batch samplers (the
recipe's LengthBucketBatchSampler, funasr's buffer samplers) sort the whole set by length and deal the
batches to the ranks, so any rank reads utterances from any shard.

The copies are checked against their source: each is streamed through crc32 (2 GB/s a core), written
to a temporary name, read back and compared, renamed into place, and then described by a sidecar
(source path, size, mtime_ns, crc32). On a rerun a copy is current when its source still has that size
and mtime and the copy still has that crc32 (read back locally, in parallel): a changed dump/ is copied
again file by file, a damaged copy is copied again, and a copy that was killed half-way (a temporary
file, or a copy without its sidecar) is never taken as current. A stage-1 shard's .ark also carries the
size and crc32 stage 1 recorded in its marker (features/shard_sums.py): its copy is checked against that
record too, so a shard damaged in dump/ (or on its way here) stops the fill naming it rather than be
copied faithfully, and a copy is current only while its sidecar's crc32 is still the record's.

Too little free space for what must be copied (plus ``reserve_bytes`` kept free: /dev/shm is memory the
DataLoader workers share tensors through) falls back to the shared dump/ with a warning naming both sizes.

Reads  <dump>/<set>/data.jsonl and the files their sources name under <dump>/;
writes <cache>/<dump name>-<8 hex of its path>/ (the view, given to stage 2 as its --dump-dir): the copies
       at their paths relative to <dump>, <set>/data.jsonl with the sources rewritten into the view and
       its line index <set>/data.jsonl.idx (data/line_index.py), symbolic links to everything else of
       <dump> (am.mvn, tokenizer/, the shards' .scp...: stage 2 resolves them, so its config names the
       shared files), .cache/<path>.json (the sidecars) and cache.json (what the last fill did).

  result = fill(Path("dump"), Path("/dev/shm/asr"), ["train", "dev"])
  result.dump_dir       # the view, or Path("dump") after a fallback
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import threading
import time
import zlib
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from funasr_recipe.core.files import write_atomic
from funasr_recipe.core.jsonl import iter_jsonl
from funasr_recipe.core.log import Progress
from funasr_recipe.core.rejections import BadInputError
from funasr_recipe.data import line_index
from funasr_recipe.features.shard_sums import ADVICE, recorded_sum

log = logging.getLogger(__name__)

CHUNK = 8 << 20  # large reads: fewer syscalls, and zlib releases the GIL only for buffers over 5 KiB
SIDECARS = ".cache"
SUMMARY = "cache.json"
# kaldiio's "<path>:<offset>" and "<path>:<offset>[<slice>]"; a source without an offset is a whole file.
_SOURCE = re.compile(r"^(?P<path>.+?)(?P<rest>:\d+(?:\[[^\]]*\])?)?$")


def split_source(source: str) -> tuple[str, str]:
    """``"/d/shards/00000.ark:24"`` -> ``("/d/shards/00000.ark", ":24")``; a plain path keeps ``""``."""
    m = _SOURCE.match(source)
    if m is None:
        raise BadInputError(f"empty source {source!r}")
    return m["path"], m["rest"] or ""


def human(n: float) -> str:
    """``83987456`` -> ``80.1 MiB``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def disk_free(path: Path) -> int:
    """Bytes free to this user on the filesystem of ``path``."""
    return shutil.disk_usage(path).free


def view_dir(cache_root: Path, dump_dir: Path) -> Path:
    """Where the copy of ``dump_dir`` lives under ``cache_root``: keyed by the dump's absolute path, so
    that two dump dirs (two configs, two corpora) share a cache root without mixing."""
    key = hashlib.sha1(str(dump_dir.resolve()).encode()).hexdigest()[:8]
    return cache_root / f"{dump_dir.resolve().name}-{key}"


def crc32_file(path: Path) -> str:
    """The crc32 of a file's bytes, as 8 hex digits."""
    crc = 0
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            crc = zlib.crc32(block, crc)
    return f"{crc:08x}"


@dataclass(frozen=True)
class Entry:
    """One file to have in the view: its source in dump/, its copy, and the source's size and mtime."""

    src: Path
    dst: Path
    sidecar: Path
    size: int
    mtime_ns: int
    recorded: dict | None = None  # stage 1's {"bytes", "crc32"} of a shard's file; None for other files

    def key(self) -> dict:
        return {"source": str(self.src), "size": self.size, "mtime_ns": self.mtime_ns}


@dataclass
class Plan:
    """What a fill does: the files the lists name (by copy), each set's list, and the sources left alone."""

    view: Path
    entries: dict[Path, Entry] = field(default_factory=dict)
    lists: dict[str, Path] = field(default_factory=dict)
    outside: set[str] = field(default_factory=set)  # sources not under dump/: read where they are


@dataclass
class CacheResult:
    """What ``fill`` did; ``dump_dir`` is what stage 2 reads: the view, or the shared dump (fallback)."""

    dump_dir: Path
    files: int = 0
    bytes: int = 0
    copied: int = 0
    copied_bytes: int = 0
    seconds: float = 0.0
    fallback: str | None = None  # why the shared dump is read instead


def plan_fill(dump_dir: Path, view: Path, sets: Iterable[str]) -> Plan:
    """The files the sets' lists name, with their copies in ``view`` (one stat per distinct file)."""
    root = Path(os.path.realpath(dump_dir))
    plan = Plan(view)
    seen: dict[str, Path | None] = {}
    for name in sets:
        jsonl = dump_dir / name / "data.jsonl"
        if not jsonl.is_file():
            raise FileNotFoundError(f"{jsonl} is missing: run stage 1 for set {name} first")
        plan.lists[name] = jsonl
        for lineno, obj in iter_jsonl(jsonl):
            source = obj.get("source")
            if not isinstance(source, str):
                raise BadInputError(f"{jsonl}:{lineno}: no 'source': not a stage-1 data.jsonl line")
            path = split_source(source)[0]
            if path in seen:
                continue
            real = Path(os.path.realpath(path))
            seen[path] = rel = real.relative_to(root) if real.is_relative_to(root) else None
            if rel is None:
                plan.outside.add(path)
                continue
            try:
                st = real.stat()
            except OSError as e:
                raise FileNotFoundError(f"{jsonl}:{lineno}: cannot stat {path} ({e.strerror}): rerun "
                                        "stage 1") from None
            plan.entries[real] = Entry(real, view / rel, view / SIDECARS / f"{rel}.json", st.st_size,
                                       st.st_mtime_ns, recorded_sum(real))
    return plan


def is_current(entry: Entry) -> bool:
    """The copy is there, its sidecar describes this source as it is now, and its bytes still match."""
    if entry.dst.is_symlink():
        return False
    try:
        side = json.loads(entry.sidecar.read_text(encoding="utf-8"))
        if {k: side.get(k) for k in ("source", "size", "mtime_ns")} != entry.key():
            return False
        if entry.recorded is not None and side.get("crc32") != entry.recorded.get("crc32"):
            return False
        return entry.dst.stat().st_size == entry.size and crc32_file(entry.dst) == side.get("crc32")
    except (OSError, ValueError):
        return False


def copy_entry(entry: Entry, on_bytes: Callable[[int], None] = lambda n: None) -> None:
    """Copy one file through crc32 to a temporary name, read it back and compare, rename it into place,
    then write its sidecar. The sidecar goes first and comes back last: killed anywhere in between, the
    file is not current on the next run."""
    entry.sidecar.unlink(missing_ok=True)
    entry.dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = entry.dst.with_name(f".{entry.dst.name}.tmp{os.getpid()}.{threading.get_ident()}")
    crc = 0
    try:
        with open(entry.src, "rb") as src, open(tmp, "wb") as dst:
            while block := src.read(CHUNK):
                crc = zlib.crc32(block, crc)
                dst.write(block)
                on_bytes(len(block))
        digest = f"{crc:08x}"
        st = entry.src.stat()
        if (st.st_size, st.st_mtime_ns) != (entry.size, entry.mtime_ns):
            raise RuntimeError(f"{entry.src} changed while it was copied (is stage 1 running?): run again")
        want = entry.recorded
        if want is not None and (entry.size, digest) != (want.get("bytes"), want.get("crc32")):
            raise RuntimeError(f"{entry.src}: stage 1 recorded {want.get('bytes')} bytes with crc32 "
                               f"{want.get('crc32')}, it has {entry.size} with crc32 {digest}; {ADVICE} "
                               "(python -m local.compute_fbank verify --repair true names them all)")
        if tmp.stat().st_size != entry.size or crc32_file(tmp) != digest:
            raise OSError(errno.EIO, f"the copy of {entry.src} in {tmp} does not read back as written")
        os.replace(tmp, entry.dst)
    finally:
        tmp.unlink(missing_ok=True)
    entry.sidecar.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(entry.sidecar, json.dumps({**entry.key(), "crc32": digest}) + "\n")


def unlink_links_on_the_way(plan: Plan) -> None:
    """Remove the view's links (made by an earlier run, for sets or files not cached then) that lead into
    dump/ where this plan has real files: through one, a copy or a removal would touch the shared dump."""
    rels = [e.dst.relative_to(plan.view) for e in plan.entries.values()] + [Path(n, "data.jsonl")
                                                                             for n in plan.lists]
    for rel in rels:
        for part in (*reversed(rel.parents), rel):
            if (plan.view / part).is_symlink():
                (plan.view / part).unlink()


def prune(plan: Plan, sets: Iterable[str]) -> None:
    """Remove from the sets' part of the view what this plan does not hold: copies of files the lists no
    longer name (space), temporary files of a killed copy, and the links (made again); then sidecars
    without their copy."""
    keep = {e.dst for e in plan.entries.values()}
    for name in sets:
        for dirpath, dirnames, filenames in os.walk(plan.view / name):
            for leaf in (*dirnames, *filenames):
                path = Path(dirpath) / leaf
                if path.is_symlink() or (path.is_file() and path not in keep):
                    path.unlink()
    for dirpath, _, filenames in os.walk(plan.view / SIDECARS):
        for leaf in filenames:
            side = Path(dirpath) / leaf
            if not (plan.view / side.relative_to(plan.view / SIDECARS).with_suffix("")).is_file():
                side.unlink()


def link_rest(dump_dir: Path, plan: Plan) -> None:
    """Links from the view to everything of dump/ it holds no file of (am.mvn, tokenizer/, the shards'
    scp and jsonl...), so that the view is a dump dir: only the directories on the way to a copy or a
    list are real."""
    root = Path(os.path.realpath(dump_dir))
    # The lists and their line indexes are the view's own (write_lists): the dump's would not match.
    real = {e.dst.relative_to(plan.view) for e in plan.entries.values()} | {
        Path(n) / f for n in plan.lists for f in ("data.jsonl", "data.jsonl" + line_index.SUFFIX)}
    dirs = {p for rel in real for p in rel.parents}
    for rel_dir in sorted(dirs):
        for src in sorted((root / rel_dir).iterdir()):
            rel = src.relative_to(root)
            link = plan.view / rel
            if rel in real or rel in dirs or link.is_symlink() or link.exists():
                continue
            link.symlink_to(src)


def write_lists(plan: Plan) -> None:
    """Each set's data.jsonl with the sources of copied files pointing into the view (atomically, a line
    at a time), and its line index (data/line_index.py), which stage 2's IndexDSJsonlMmap maps."""
    where: dict[str, str] = {}  # a source's file -> the file the view's list names (itself when not copied)
    for name, jsonl in plan.lists.items():
        out = plan.view / name / "data.jsonl"
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
        with open(tmp, "w", encoding="utf-8") as f:
            for _, obj in iter_jsonl(jsonl):
                path, rest = split_source(obj["source"])
                if path not in where:
                    entry = plan.entries.get(Path(os.path.realpath(path)))
                    where[path] = str(entry.dst) if entry is not None else path
                obj["source"] = where[path] + rest
                f.write(json.dumps(obj, ensure_ascii=False) + "\n")
        os.replace(tmp, out)
        line_index.build_index(out)


def _in_parallel(work: Callable[[Entry], object], entries: list[Entry], threads: int) -> list:
    with ThreadPoolExecutor(max(1, threads)) as pool:
        return list(pool.map(work, entries))


def fill(dump_dir: Path, cache_root: Path, sets: Iterable[str], threads: int = 8,
         reserve_bytes: int = 1 << 30, free_bytes: Callable[[Path], int] = disk_free,
         progress_interval: float = 10.0) -> CacheResult:
    """Bring this node's copy of what the sets' lists name up to date (see the module docstring); one run
    at a time per view (a lock file: a second run on the node waits, then finds it current)."""
    sets = list(dict.fromkeys(sets))
    if Path(os.path.realpath(cache_root)).is_relative_to(os.path.realpath(dump_dir)):
        raise BadInputError(f"--local-cache {cache_root} is inside the dump dir {dump_dir}: give a "
                            "node-local dir (NVMe, /dev/shm)")
    view = view_dir(Path(os.path.abspath(cache_root)), dump_dir)
    view.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with open(view / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        (view / SUMMARY).unlink(missing_ok=True)
        plan = plan_fill(dump_dir, view, sets)
        unlink_links_on_the_way(plan)  # first: everything below reads, removes or writes in the view
        result = _update(plan, dump_dir, sets, threads, reserve_bytes, free_bytes, progress_interval)
        result.seconds = time.monotonic() - start
        if result.fallback:
            log.warning("local cache %s %s: training reads the shared %s instead", view, result.fallback,
                        dump_dir)
            return result
        link_rest(dump_dir, plan)
        write_lists(plan)
        result.dump_dir = view
        summary = {"dump_dir": str(dump_dir.resolve()), "sets": sets, "files": result.files,
                   "bytes": result.bytes, "copied": result.copied, "copied_bytes": result.copied_bytes,
                   "seconds": round(result.seconds, 2), "checksum": "crc32", "outside": len(plan.outside)}
        write_atomic(view / SUMMARY, json.dumps(summary, indent=1) + "\n")
    log.info("local cache %s: copied %d file(s) (%s), %d current, in %.1f s; training reads it", view,
             result.copied, human(result.copied_bytes), result.files - result.copied, result.seconds)
    return result


def _update(plan: Plan, dump_dir: Path, sets: list[str], threads: int, reserve_bytes: int,
            free_bytes: Callable[[Path], int], interval: float) -> CacheResult:
    """Check the copies, make room, copy what is not current; ``fallback`` set when it does not fit."""
    entries = sorted(plan.entries.values(), key=lambda e: e.dst)
    result = CacheResult(dump_dir, len(entries), sum(e.size for e in entries))
    todo = [e for e, ok in zip(entries, _in_parallel(is_current, entries, threads), strict=True) if not ok]
    for e in todo:  # a stale copy's space is free for its new one
        e.dst.unlink(missing_ok=True)
    prune(plan, sets)
    need, free = sum(e.size for e in todo), free_bytes(plan.view)
    log.info("local cache %s: %d files (%s) for sets %s; %d current, %d to copy (%s), %s free", plan.view,
             len(entries), human(result.bytes), " ".join(sets), len(entries) - len(todo), len(todo),
             human(need), human(free))
    if plan.outside:
        log.warning("%d source file(s) are outside %s and are read where they are, e.g. %s",
                    len(plan.outside), dump_dir, min(plan.outside))
    if need + reserve_bytes > free:
        result.fallback = (f"needs {human(need)} ({need} bytes) plus {human(reserve_bytes)} kept free, has "
                           f"{human(free)} ({free} bytes) free")
        return result
    try:
        _copy_all(todo, threads, interval)
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        result.fallback = f"ran out of space while copying ({e.strerror})"
        return result
    result.copied, result.copied_bytes = len(todo), need
    return result


def _copy_all(todo: list[Entry], threads: int, interval: float) -> None:
    """Copy in parallel threads (the reads, writes and crc32 release the GIL), with one progress line."""
    if not todo:
        return
    need = sum(e.size for e in todo)
    unit, shift = ("MiB", 20) if need >= 1 << 30 else ("KiB", 10)  # whole units: Progress counts integers
    progress = Progress("copying to the local cache", -(-need >> shift), unit=unit, interval=interval,
                        logger=log)
    lock, done = threading.Lock(), [0]

    def count(n: int) -> None:
        with lock:
            done[0] += n
            progress.update((done[0] >> shift) - progress.count)

    _in_parallel(lambda e: copy_entry(e, count), todo, threads)
    progress.close()
