r"""JSON Lines files, read with line numbers so that a bad line is named (``file:line``); writes nothing.

Lines end at "\n" only (a lone "\r" too, which JSON never holds raw): text-mode iteration, never
``str.splitlines()``, which would also cut a line at U+2028, U+2029 or U+0085 inside a key or a
transcript. A UTF-8 byte-order mark before the first line (an editor's) is no part of it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from funasr_recipe.core.rejections import BadInputError


def iter_jsonl(path: Path) -> Iterator[tuple[int, dict]]:
    """(1-based line number, object) of every non-blank line; ValueError naming file:line on a line that
    is not a JSON object."""
    with open(path, encoding="utf-8-sig") as f:
        for lineno, line in enumerate(f, 1):
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
