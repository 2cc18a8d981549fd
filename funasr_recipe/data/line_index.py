"""A jsonl's line index on disk: each line's byte offset and the numbers funasr's index filters and the
batch samplers read, in one file that every process maps read-only, so that a node's processes share its
pages and a line is parsed only when its item is fetched (data/index_ds.py: IndexDSJsonlMmap).

Reads  a jsonl (stage 1's dump/<set>/{data,raw}.jsonl, replay's train list, a user's own);
writes <jsonl>.idx beside it or, where that folder is not writable, <cache>/<sha1 of its path>.<name>.idx
       (<cache>: $FUNASR_RECIPE_INDEX_CACHE, default ~/.cache/funasr-recipe/index).

Layout: MAGIC, a little-endian uint64 header length, a JSON header (the jsonl's size, line count, sha1 of
its first and last 64 KiB; space-padded to 64 bytes), then offsets int64[n + 1] (line i is the bytes
offsets[i]..offsets[i + 1]), source_len int32[n], target_len int32[n], flags uint8[n] (HAS_SOURCE: a line
funasr's index reads; blank lines and lines without "source" have 0). Its bytes depend on the jsonl's
bytes alone, so a rerun of stage 1 writes the same index.

``load_index`` trusts an index only when it is not older than the jsonl, records the jsonl's size, head
and tail, and ``SAMPLES`` lines spread over the file begin and end where it says and parse to the numbers
it holds; otherwise it rebuilds it, one process at a time (a lock file beside the index: the others wait,
then map what it wrote). A line that is not a JSON object, or whose source_len / target_len is not an
integer, is a BadInputError naming the file and the line.

  index = load_index(Path("dump/train/data.jsonl"))   # built first when missing or stale
  index.source_len[i], json.loads(index.line(i))
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import math
import mmap
import os
import struct
import time
from array import array
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from funasr_recipe.core.log import Progress
from funasr_recipe.core.rejections import BadInputError

log = logging.getLogger(__name__)

MAGIC = b"FRIDX\x001\n"
VERSION = 1
SUFFIX = ".idx"
HAS_SOURCE = 1
EDGE = 1 << 16  # bytes of the jsonl's head and tail whose sha1 the header records
SAMPLES = 32  # lines re-read and re-parsed when an index is opened
CACHE_ENV = "FUNASR_RECIPE_INDEX_CACHE"
INT32 = 1 << 31


def index_path(jsonl: Path) -> Path:
    """Where ``jsonl``'s index lives: beside it, or in the cache dir when its folder is not writable."""
    beside = jsonl.with_name(jsonl.name + SUFFIX)
    if beside.exists() or os.access(jsonl.parent, os.W_OK):
        return beside
    return cached_path(jsonl)


def cached_path(jsonl: Path) -> Path:
    root = Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "funasr-recipe" / "index")
    digest = hashlib.sha1(os.fsencode(os.path.realpath(jsonl))).hexdigest()[:20]
    return root / f"{digest}.{jsonl.name}{SUFFIX}"


def _edges(f: Any, size: int) -> tuple[str, str]:
    f.seek(0)
    head = hashlib.sha1(f.read(EDGE)).hexdigest()
    f.seek(max(0, size - EDGE))
    return head, hashlib.sha1(f.read(EDGE)).hexdigest()


def _length(obj: dict, name: str, default: int, where: str) -> int:
    value = obj.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or value != int(value) or not -INT32 <= value < INT32:
        raise BadInputError(f"{where}: {obj.get('key', '')}: {name} {value!r} is not an integer (funasr's "
                            "index filters and the batch samplers compare it as a length)")
    return int(value)


def parse_line(raw: bytes, where: str) -> tuple[int, int, int]:
    """(flags, source_len, target_len) of one line as funasr's index reads it; BadInputError naming
    ``where`` (file:line) when it is not a JSON object, or holds what the index cannot train on."""
    if not raw.strip():
        return 0, 0, 0
    try:
        obj = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadInputError(f"{where}: not JSON ({getattr(e, 'msg', e)}): fix or remove the line") from None
    if not isinstance(obj, dict):
        raise BadInputError(f"{where}: not a JSON object")
    if "text" in obj:
        raise BadInputError(f"{where}: {obj.get('key', '')}: a \"text\" field: funasr's index makes it an "
                            "item of its own (text-only LLM data), which the speech datasets cannot load; "
                            "rename the field")
    if "source" not in obj:
        return 0, 0, 0
    if not isinstance(obj["source"], str) or not isinstance(obj.get("target"), str):
        raise BadInputError(f"{where}: {obj.get('key', '')}: \"source\" and \"target\" must be strings "
                            f"(have {type(obj['source']).__name__}, {type(obj.get('target')).__name__})")
    return HAS_SOURCE, _length(obj, "source_len", 1, where), _length(obj, "target_len", 0, where)


def build_index(jsonl: Path, out: Path | None = None) -> Path:
    """Write ``jsonl``'s index (default: ``index_path``) in one pass, atomically; returns its path."""
    out = out or index_path(jsonl)
    offsets, src, tgt, flags = array("q", [0]), array("i"), array("i"), array("B")
    size = os.path.getsize(jsonl)
    start = time.monotonic()
    progress = Progress(f"{jsonl}: line index", size >> 20, unit="MiB", logger=log)
    with open(jsonl, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            flag, s, t = parse_line(raw, f"{jsonl}:{lineno}")
            flags.append(flag)
            src.append(s)
            tgt.append(t)
            offsets.append(offsets[-1] + len(raw))
            if not lineno & 0xFFFF:
                progress.update((offsets[-1] >> 20) - progress.count)
        if offsets[-1] != size:
            raise BadInputError(f"{jsonl}: changed while it was indexed ({size} bytes, then {offsets[-1]})")
        head, tail = _edges(f, size)
    header = json.dumps({"version": VERSION, "size": size, "lines": len(flags), "head": head, "tail": tail})
    body = header.encode() + b" " * (-(len(MAGIC) + 8 + len(header)) % 64)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as w:
        w.write(MAGIC + struct.pack("<Q", len(body)) + body)
        for part in (offsets, src, tgt, flags):
            w.write(part)  # the buffer itself: no copy of a 10 M-line array
    os.replace(tmp, out)
    # "Not older than its jsonl" must hold even where the jsonl's clock (an NFS server's) runs ahead.
    if (mtime := os.stat(jsonl).st_mtime_ns) > os.stat(out).st_mtime_ns:
        os.utime(out, ns=(mtime, mtime))
    log.info("%s: %d lines indexed in %.1f s -> %s", jsonl, len(flags), time.monotonic() - start, out)
    return out


_FDS: OrderedDict[str, int] = OrderedDict()  # open jsonl files, least recently read first
MAX_FDS = 64  # a list file may name thousands of jsonl files


def _fd(path: str) -> int:
    fd = _FDS.pop(path, None)
    if fd is None:
        fd = os.open(path, os.O_RDONLY)
        while len(_FDS) >= MAX_FDS:
            os.close(_FDS.popitem(last=False)[1])
    _FDS[path] = fd
    return fd


class LineIndex:
    """One jsonl's mapped index: ``source_len``, ``target_len``, ``flags`` (read-only numpy views of the
    shared mapping), ``len()`` lines, and ``line(i)``, the bytes of line i read with pread (forked workers
    share the descriptor: pread has no file position)."""

    def __init__(self, jsonl: Path, path: Path) -> None:
        self.jsonl, self.path = jsonl, path
        with open(path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        if self._map[: len(MAGIC)] != MAGIC:
            raise ValueError(f"{path}: not a line index")
        length = struct.unpack_from("<Q", self._map, len(MAGIC))[0]
        start = len(MAGIC) + 8
        self.header = json.loads(self._map[start : start + length])
        n = self.header["lines"]
        pos = start + length
        arrays = {}
        for name, dtype, count in (("offsets", np.int64, n + 1), ("source_len", np.int32, n),
                                   ("target_len", np.int32, n), ("flags", np.uint8, n)):
            arrays[name] = np.frombuffer(self._map, dtype=dtype, count=count, offset=pos)
            pos += count * np.dtype(dtype).itemsize
        self.offsets, self.source_len = arrays["offsets"], arrays["source_len"]
        self.target_len, self.flags = arrays["target_len"], arrays["flags"]

    def __len__(self) -> int:
        return len(self.flags)

    def line(self, i: int) -> bytes:
        start, end = int(self.offsets[i]), int(self.offsets[i + 1])
        return os.pread(_fd(str(self.jsonl)), end - start, start)

    def stale(self) -> str | None:
        """Why this index does not describe its jsonl as it is now (None: it does)."""
        st, own = os.stat(self.jsonl), os.stat(self.path)
        if self.header.get("version") != VERSION:
            return f"version {self.header.get('version')}, not {VERSION}"
        if self.header["size"] != st.st_size:
            return f"the jsonl has {st.st_size} bytes, the index says {self.header['size']}"
        if own.st_mtime_ns < st.st_mtime_ns:
            return "the jsonl is newer"
        with open(self.jsonl, "rb") as f:
            if _edges(f, st.st_size) != (self.header["head"], self.header["tail"]):
                return "the jsonl's first or last 64 KiB differ"
        for i in sorted({int(x) for x in np.linspace(0, len(self) - 1, SAMPLES)} if len(self) else ()):
            raw = self.line(i)
            start = int(self.offsets[i])
            if (start and os.pread(_fd(str(self.jsonl)), 1, start - 1) != b"\n") or b"\n" in raw[:-1] \
                    or (not raw.endswith(b"\n") and int(self.offsets[i + 1]) != st.st_size):
                return f"line {i + 1} is not where the index says"
            try:
                parsed = parse_line(raw, "")
            except BadInputError:
                return f"line {i + 1} no longer parses"
            if parsed != (int(self.flags[i]), int(self.source_len[i]), int(self.target_len[i])):
                return f"line {i + 1} holds other lengths"
        return None

    def __getstate__(self) -> dict:
        # A spawned DataLoader worker maps the file again instead of receiving a copy of the arrays.
        return {"jsonl": self.jsonl, "path": self.path}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["jsonl"], state["path"])


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(f".{path.name}.lock"), "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("%s: another process is building it; waiting", path)
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _valid(jsonl: Path, path: Path, say: bool = True) -> LineIndex | None:
    if not path.is_file():
        return None
    try:
        index = LineIndex(jsonl, path)
        why = index.stale()
    except (ValueError, KeyError, OSError, struct.error) as e:  # a foreign or cut file: rebuilt
        why = f"unreadable ({e})"
    if why is None:
        return index
    if say:
        log.info("%s does not match %s (%s): rebuilding it", path, jsonl, why)
    return None


def load_index(jsonl: Path) -> LineIndex:
    """``jsonl``'s index, checked (module docstring); built first when it is missing or stale, by one
    process at a time."""
    jsonl = Path(jsonl)
    if not jsonl.is_file():
        raise BadInputError(f"{jsonl}: no such file")
    beside = jsonl.with_name(jsonl.name + SUFFIX)
    if (index := _valid(jsonl, beside)) is not None:
        return index
    target = beside if os.access(jsonl.parent, os.W_OK) else cached_path(jsonl)
    if target != beside and (index := _valid(jsonl, target)) is not None:
        return index
    with _locked(target):
        if (index := _valid(jsonl, target, say=False)) is None:  # another process may have built it meanwhile
            build_index(jsonl, target)
            index = LineIndex(jsonl, target)
    return index
