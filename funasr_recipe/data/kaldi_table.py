r"""Read Kaldi table files (``key value`` lines) as key-sorted streams, in flat memory.

Kaldi data dirs are meant to be sorted by key, but users' files often are not. Each file is
streamed once, every line parsed in bytes (so a non-UTF-8 line is reported, not fatal), written to
a temporary file and sorted by GNU ``sort``, which spills to disk: memory stays flat however large
the corpus. Records keep their 1-based line number so that every problem names its line. A line ends
at ``\r\n``, ``\r`` or ``\n`` (Windows, old Mac and Unix editors), and a UTF-8 byte-order mark
before the first line is no part of it. A file that cannot be read raises TableError naming it.

  for rec in sorted_records(Path("data/train/text"), tmp_dir): ...
  rows = read_table(Path("corpus/data/all/wav.scp"))  # [(key, value)] in file order, small tables
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import unicodedata
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from funasr_recipe.core.rejections import BadInputError

BOM = b"\xef\xbb\xbf"
_EOL = re.compile(rb"\r\n|\r|\n")
BLOCK = 1 << 20  # bytes read at a time by iter_lines


@dataclass(frozen=True)
class Record:
    """One line of a Kaldi table file."""

    key: str
    lineno: int
    value: str  # everything after the first run of whitespace, stripped
    error: str | None = None  # non_utf8 | control_chars | None
    detail: str = ""


def has_control_chars(text: str) -> bool:
    """True if text holds a control character (C0/C1, DEL, or Unicode category Cc/Cf except ZWJ/ZWNJ).

    A tab is not one: Kaldi tables use it as a field separator, and transcripts collapse it.
    """
    for ch in text:
        if ch == "\t":
            continue
        cat = unicodedata.category(ch)
        if cat == "Cc" or (cat == "Cf" and ch not in "\u200c\u200d"):
            return True
    return False


def parse_line(raw: bytes, lineno: int) -> Record | None:
    """Parse one raw line; None for a blank line. A key that is not UTF-8 is shown escaped."""
    line = raw.rstrip(b"\r\n")
    if lineno == 1 and line.startswith(BOM):
        line = line[3:]  # a UTF-8 byte-order mark (Windows editors) marks the encoding; it is no content
    parts = line.strip().split(None, 1)
    if not parts:
        return None
    key_b = parts[0]
    value_b = parts[1].strip() if len(parts) > 1 else b""
    try:
        key = key_b.decode("utf-8")
    except UnicodeDecodeError:
        key = key_b.decode("utf-8", "backslashreplace")
        return Record(key, lineno, "", "non_utf8", f"key is not UTF-8: {key}")
    try:
        value = value_b.decode("utf-8")
    except UnicodeDecodeError as e:
        shown = value_b.decode("utf-8", "backslashreplace")
        return Record(key, lineno, "", "non_utf8", f"byte {e.start} is not UTF-8: {shown!r}")
    if has_control_chars(key) or has_control_chars(value):
        return Record(key, lineno, value, "control_chars", f"control character in {value!r}")
    return Record(key, lineno, value)


class TableError(BadInputError):
    """A Kaldi table that cannot be read as one: the message names the file (and the line)."""


def open_table(path: Path) -> BinaryIO:
    """``open(path, "rb")``, with a file the user may not read reported as TableError naming it: it is
    bad input to fix (exit 2), not a crash."""
    try:
        return open(path, "rb")
    except PermissionError:
        raise TableError(f"{path}: permission denied: this user cannot read it (check the mode and owner "
                         "of the file and of its directories)") from None


def iter_lines(f: BinaryIO, block: int = BLOCK) -> Iterator[bytes]:
    r"""The raw lines of a binary file, each with its line end, streamed. ``\r\n``, a lone ``\r`` and
    ``\n`` each end one line: a file saved by an old Mac editor is not one line."""
    pending = b""
    while chunk := f.read(block):
        data = pending + chunk
        start = 0
        for m in _EOL.finditer(data):
            if m.end() == len(data) and data.endswith(b"\r"):
                break  # the block may have cut a \r\n in two: wait for the next byte
            yield data[start:m.end()]
            start = m.end()
        pending = data[start:]
    if pending:
        yield pending


def first_field(raw: bytes, lineno: int) -> bytes | None:
    """The key of a raw line as bytes (without the byte-order mark of line 1); None for a blank line."""
    if lineno == 1 and raw.startswith(BOM):
        raw = raw[3:]
    parts = raw.split(None, 1)
    return parts[0] if parts else None


def count_lines(path: Path) -> int:
    """Number of lines of a file, a last line without line end included (streamed)."""
    with open_table(path) as f:
        return sum(1 for _ in iter_lines(f))


def sorted_records(path: Path, tmp_dir: Path, blank_lines: list[int] | None = None) -> Iterator[Record]:
    """Yield the records of a Kaldi file sorted by (key, line number); blank lines are left out
    and their line numbers appended to ``blank_lines``.

    Sorting is done by ``LC_ALL=C sort`` on UTF-8 bytes, which orders like Python's str comparison,
    so the streams of several files of one data dir can be merged by key.
    """
    def parsed() -> Iterator[Record]:
        with open_table(path) as src:
            for lineno, raw in enumerate(iter_lines(src), start=1):
                rec = parse_line(raw, lineno)
                if rec is not None:
                    yield rec
                elif blank_lines is not None:
                    blank_lines.append(lineno)

    return sort_records(parsed(), path.name, tmp_dir)


def sort_records(records: Iterable[Record], name: str, tmp_dir: Path) -> Iterator[Record]:
    """``records`` sorted by (key, line number) on disk, as sorted_records sorts a file's (``name``
    names the temporary files in tmp_dir): for records made from a file, such as resolved segments."""
    unsorted = tmp_dir / f"{name}.unsorted"
    ordered = tmp_dir / f"{name}.sorted"
    with open(unsorted, "w", encoding="utf-8") as dst:
        for rec in records:
            payload = json.dumps([rec.value, rec.error, rec.detail], ensure_ascii=False)
            dst.write(f"{rec.key}\t{rec.lineno}\t{payload}\n")
    env = dict(os.environ, LC_ALL="C")
    subprocess.run(["sort", "-t", "\t", "-k1,1", "-k2,2n", "-s", "-S", "64M", "-T", str(tmp_dir),
                    "-o", str(ordered), str(unsorted)], check=True, env=env)
    unsorted.unlink()
    return _read_sorted(ordered)


def _read_sorted(ordered: Path) -> Iterator[Record]:
    try:
        with open(ordered, encoding="utf-8", newline="\n") as f:
            for line in f:
                key, lineno, payload = line.rstrip("\n").split("\t", 2)
                value, error, detail = json.loads(payload)
                yield Record(key, int(lineno), value, error, detail)
    finally:
        ordered.unlink(missing_ok=True)


def iter_table(path: Path) -> Iterator[Record]:
    """Every non-blank line's record, in file order, duplicates kept (streamed). A line that is not
    UTF-8, or a file that cannot be read, raises TableError naming the file (and line); other problems
    are the caller's to judge."""
    with open_table(path) as f:
        for lineno, raw in enumerate(iter_lines(f), start=1):
            rec = parse_line(raw, lineno)
            if rec is None:
                continue
            if rec.error == "non_utf8":
                raise TableError(f"{path}:{lineno}: {rec.detail}")
            yield rec


def read_table(path: Path) -> list[tuple[str, str]]:
    """``(key, value)`` of every record of ``iter_table``: for a corpus's own tables, which recipes copy as
    they are (validation is stage 0's)."""
    return [(rec.key, rec.value) for rec in iter_table(path)]
