r"""JSON Lines files, read with line numbers so that a bad line is named (``file:line``); writes nothing.

Lines end at "\n" only (a lone "\r" too, which JSON never holds raw): text-mode iteration, never
``str.splitlines()``, which would also cut a line at U+2028, U+2029 or U+0085 inside a key or a
transcript. A UTF-8 byte-order mark before the first line (an editor's) is no part of it. A gzipped
file (``.jsonl.gz``, as FunASR and lhotse users keep large manifests) is read as its content: known by
its magic bytes, not by its name, so a renamed file reads too.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path

from funasr_recipe.core.rejections import BadInputError

GZIP_MAGIC = b"\x1f\x8b"


def iter_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(1-based line number, line) of a UTF-8 text file, gzipped or not; a BadInputError naming the file
    and the last good line where it is not UTF-8 or its gzip stream is cut or corrupt."""
    with open(path, "rb") as probe:
        gzipped = probe.read(2) == GZIP_MAGIC
    with (gzip.open if gzipped else open)(path, "rt", encoding="utf-8-sig") as f:
        lines, lineno = iter(f), 0
        while True:
            try:
                line = next(lines)
            except StopIteration:
                return
            except UnicodeDecodeError as e:  # decoded in blocks: the bad byte is after the last good line
                raise BadInputError(f"{path}: not UTF-8 text after line {lineno} ({e.reason})") from None
            except (EOFError, OSError) as e:  # gzip.BadGzipFile is an OSError
                raise BadInputError(f"{path}: the gzip file is cut or corrupt after line {lineno} "
                                    f"({e})") from None
            lineno += 1
            yield lineno, line


def iter_jsonl(path: Path) -> Iterator[tuple[int, dict]]:
    """(1-based line number, object) of every non-blank line; BadInputError naming file:line on a line
    that is not a JSON object."""
    for lineno, line in iter_lines(path):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise BadInputError(f"{path}:{lineno}: not a JSON object ({e.msg})") from None
        if not isinstance(obj, dict):
            raise BadInputError(f"{path}:{lineno}: not a JSON object")
        yield lineno, obj


def read_jsonl(path: Path) -> list[tuple[int, dict]]:
    """``iter_jsonl`` as a list."""
    return list(iter_jsonl(path))
