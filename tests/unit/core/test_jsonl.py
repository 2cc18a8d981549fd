"""Tests of funasr_recipe/core/jsonl.py: gzipped JSONL read as its content, and bad files named.

Writes small JSONL files under tmp_path.

  python -m pytest -q tests/unit/core/test_jsonl.py
"""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from funasr_recipe.core.jsonl import iter_jsonl
from funasr_recipe.core.rejections import BadInputError

LINES = '{"key": "a", "target": "één"}\n\n{"key": "b", "target": "x\u2028y"}\n'


def test_gzipped_jsonl_reads_as_plain(tmp_path: Path) -> None:
    plain, packed = tmp_path / "val.jsonl", tmp_path / "val.jsonl.gz"
    plain.write_text(LINES, encoding="utf-8")
    packed.write_bytes(gzip.compress(LINES.encode()))
    renamed = tmp_path / "val.jsonl.bak"  # known by its magic bytes, not its name
    renamed.write_bytes(packed.read_bytes())
    expected = [(1, {"key": "a", "target": "één"}), (3, {"key": "b", "target": "x\u2028y"})]
    assert list(iter_jsonl(plain)) == list(iter_jsonl(packed)) == list(iter_jsonl(renamed)) == expected


def test_bad_files_are_named(tmp_path: Path) -> None:
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(gzip.compress((LINES * 2000).encode())[:-20])
    with pytest.raises(BadInputError, match=rf"{cut}: the gzip file is cut or corrupt after line \d+"):
        list(iter_jsonl(cut))
    latin = tmp_path / "latin.jsonl.gz"
    latin.write_bytes(gzip.compress('{"key": "a"}\n{"key": "é"}\n'.encode("latin-1")))
    with pytest.raises(BadInputError, match=rf"{latin}: not UTF-8 text after line 0"):
        list(iter_jsonl(latin))
    broken = tmp_path / "broken.jsonl.gz"
    broken.write_bytes(gzip.compress(b'{"key": "a"}\n{"key": \n'))
    with pytest.raises(BadInputError, match=rf"{broken}:2: not a JSON object"):
        list(iter_jsonl(broken))
