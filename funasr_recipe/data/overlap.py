"""Utterances that are in two sets at once (train and dev, say): the same key, or the same audio file.

Reads  <data-dir>/<set>/data.jsonl of every set named (stage 0's output: its ``key`` and ``source``);
writes <data-dir>/overlap.tsv: a header line, then one line per utterance of a later set that an
       earlier set of the list holds too: set_a, set_b, kind, key_a, key_b, source (source as set_b has it).

kind ``key``: set_b's key is a key of set_a. kind ``audio``: a different key whose audio file is one of
set_a's, compared by resolved real path (symbolic links and ``..`` followed), so that a copy of a data
dir under new names is found. Pipe sources (``cmd |``) are not compared: their command says nothing
about the audio it makes. Memory holds one set's keys and real paths at a time; each later set is
streamed against it.

  counts = find_overlaps(Path("data"), ["train", "dev", "test"])
  # {"train/dev": {"key": 0, "audio": 2}, "train/test": {...}, "dev/test": {...}}
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from funasr_recipe.core.jsonl import iter_jsonl
from funasr_recipe.core.rejections import BadInputError
from funasr_recipe.features.audio import is_pipe

OVERLAP_TSV = "overlap.tsv"
HEADER = "set_a\tset_b\tkind\tkey_a\tkey_b\tsource\n"
KINDS = ("key", "audio")


class _RealPaths:
    """os.path.realpath of audio paths, with each directory resolved once: a million files in a few
    directories cost a million lstat calls, not ten per path."""

    def __init__(self) -> None:
        self._dirs: dict[str, str] = {}

    def __call__(self, path: str) -> str:
        head, tail = os.path.split(os.path.abspath(path))
        real_dir = self._dirs.get(head)
        if real_dir is None:
            real_dir = self._dirs[head] = os.path.realpath(head)
        joined = os.path.join(real_dir, tail)
        return os.path.realpath(joined) if os.path.islink(joined) else joined


def _utterances(data_dir: Path, name: str) -> Iterator[tuple[str, str]]:
    """(key, source) of every line of a set's data.jsonl; a line without them is bad input, named."""
    path = data_dir / name / "data.jsonl"
    for lineno, obj in iter_jsonl(path):
        if not isinstance(obj.get("key"), str) or not isinstance(obj.get("source"), str):
            raise BadInputError(f"{path}:{lineno}: not a data.jsonl line (a key and a source are needed)")
        yield obj["key"], obj["source"]


def _tsv(*cells: str) -> str:
    # tabs and line ends inside a cell would shift the columns or split the row
    return "\t".join(c.replace("\t", " ").replace("\n", " ").replace("\r", " ") for c in cells) + "\n"


def find_overlaps(data_dir: Path, sets: list[str]) -> dict[str, dict[str, int]]:
    """Write <data_dir>/overlap.tsv for every pair of ``sets`` (each set against those after it) and
    return ``{"<set_a>/<set_b>": {"key": n, "audio": n}}`` for every pair, zeros included."""
    sets = list(dict.fromkeys(sets))
    for name in sets:  # all named before any work: a set that stage 0 never wrote is a wrong --sets
        if not (data_dir / name / "data.jsonl").is_file():
            raise FileNotFoundError(f"{data_dir / name / 'data.jsonl'} is missing: run stage 0 on the set "
                                    f"{name!r} first")
    counts = {f"{a}/{b}": dict.fromkeys(KINDS, 0) for i, a in enumerate(sets) for b in sets[i + 1:]}
    out_path = data_dir / OVERLAP_TSV
    tmp = out_path.with_name(out_path.name + ".tmp")
    try:
        _write(data_dir, sets, tmp, counts)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    tmp.replace(out_path)
    return counts


def _write(data_dir: Path, sets: list[str], tmp: Path, counts: dict[str, dict[str, int]]) -> None:
    real = _RealPaths()
    with open(tmp, "w", encoding="utf-8") as out:
        out.write(HEADER)
        for i, a in enumerate(sets[:-1]):
            keys: set[str] = set()
            audio: dict[str, str] = {}  # real path -> the first key of set a with it
            for key, source in _utterances(data_dir, a):
                keys.add(key)
                if not is_pipe(source):
                    audio.setdefault(real(source), key)
            for b in sets[i + 1:]:
                for key, source in _utterances(data_dir, b):
                    if key in keys:
                        kind, key_a = "key", key
                    elif not is_pipe(source) and (key_a := audio.get(real(source))) is not None:
                        kind = "audio"
                    else:
                        continue
                    counts[f"{a}/{b}"][kind] += 1
                    out.write(_tsv(a, b, kind, key_a, key, source))
