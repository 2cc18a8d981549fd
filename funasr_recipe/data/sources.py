"""What stage 0 read from the user's corpus, as a listing of (path, size, mtime): a rerun compares it
with the files as they are now, so that an edited transcript or a replaced recording redoes stage 0 (and
what follows) instead of training on the old copy, and the log says which files changed.

The listing covers every file under the corpus dir that data/corpus.json names (the recipe reads its
layout from there) and every audio file that a set's wav.scp names outside it (a Kaldi dir's recordings
may live anywhere). Pipe entries (``cmd |``) cannot be listed: their count is written down, and their
commands are in wav.scp, whose bytes stage 0's set fingerprints already cover. Sizes and modification
times, not hashes: a stat per file keeps a rerun on a million-file corpus to a directory walk.

Reads  <data-dir>/corpus.json, <data-dir>/<set>/wav.scp, the files they name;
writes <data-dir>/.sources.tsv: "path<TAB>size<TAB>mtime_ns" lines after a "# roots" header.

  write_listing(Path("data"))                 # after the recipe has written the Kaldi dirs
  changes = compare(Path("data"))              # [] when nothing changed, else lines saying what did
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from funasr_recipe.core.files import write_atomic
from funasr_recipe.data.corpus import read_corpus_info
from funasr_recipe.data.kaldi_table import iter_table
from funasr_recipe.features.audio import is_pipe

LISTING = ".sources.tsv"
SHOWN = 5  # changed files named in the log; the count says how many there are


def _walk(root: Path) -> Iterator[tuple[str, int, int]]:
    stack = [str(root)]
    while stack:
        with os.scandir(stack.pop()) as it:
            for entry in it:
                if entry.is_dir(follow_symlinks=True):
                    stack.append(entry.path)
                elif entry.is_file(follow_symlinks=True):
                    st = entry.stat(follow_symlinks=True)
                    yield entry.path, st.st_size, st.st_mtime_ns


def _stat(path: str) -> tuple[str, int, int]:
    try:
        st = os.stat(path)
    except OSError:
        return path, -1, -1  # absent or unreadable: stage 0 rejects it; a change later is still seen
    return path, st.st_size, st.st_mtime_ns


def scan(data_dir: Path) -> tuple[list[str], dict[str, tuple[int, int]], int]:
    """(roots, {path: (size, mtime_ns)}, number of pipe entries) of what stage 0 read."""
    info = read_corpus_info(data_dir)
    root = Path(info.corpus_dir).resolve() if info.corpus_dir else None
    files: dict[str, tuple[int, int]] = {}
    if root is not None and root.is_dir():
        files.update((p, (size, mtime)) for p, size, mtime in _walk(root))
    pipes = 0
    prefix = f"{root}{os.sep}" if root is not None else None
    for name in info.sets:
        wav_scp = data_dir / name / "wav.scp"
        if not wav_scp.is_file():
            continue
        for rec in iter_table(wav_scp):
            if is_pipe(rec.value):
                pipes += 1
                continue
            path = os.path.realpath(rec.value) if rec.value else ""
            if path and path not in files and not (prefix and path.startswith(prefix)):
                files[path] = _stat(path)[1:]
    return [str(root)] if root is not None else [], files, pipes


def write_listing(data_dir: Path) -> Path:
    """Write <data-dir>/.sources.tsv for the files as they are now; returns its path."""
    roots, files, pipes = scan(data_dir)
    lines = [f"# roots\t{chr(9).join(roots)}\n", f"# pipes\t{pipes}\n"]
    lines += [f"{p}\t{size}\t{mtime}\n" for p, (size, mtime) in sorted(files.items())]
    out = data_dir / LISTING
    write_atomic(out, "".join(lines))
    return out


def read_listing(path: Path) -> dict[str, tuple[int, int]]:
    """{path: (size, mtime_ns)} of a listing (split on tabs and "\\n" only: paths may hold anything else)."""
    files = {}
    with open(path, encoding="utf-8", newline="\n") as f:
        for line in f:
            if line.startswith("#"):
                continue
            p, size, mtime = line.rstrip("\n").rsplit("\t", 2)
            files[p] = (int(size), int(mtime))
    return files


def _named(paths: list[str]) -> str:
    return ", ".join(paths[:SHOWN]) + (f" and {len(paths) - SHOWN} more" if len(paths) > SHOWN else "")


def compare(data_dir: Path) -> list[str]:
    """What changed since the listing was written: [] when nothing, else one line per kind of change.
    No listing (stage 0 never finished here) is a change too."""
    path = data_dir / LISTING
    if not path.is_file():
        return [f"no listing of the corpus files from an earlier run ({path})"]
    old = read_listing(path)
    _, new, _ = scan(data_dir)
    modified = sorted(p for p in old.keys() & new.keys() if old[p] != new[p])
    added, removed = sorted(new.keys() - old.keys()), sorted(old.keys() - new.keys())
    out = []
    if modified:
        sized = [f"{p} (size {old[p][0]} -> {new[p][0]})" if old[p][0] != new[p][0] else f"{p} (touched)"
                 for p in modified]
        out.append(f"{len(modified)} modified: {_named(sized)}")
    if added:
        out.append(f"{len(added)} added: {_named(added)}")
    if removed:
        out.append(f"{len(removed)} removed: {_named(removed)}")
    return out
