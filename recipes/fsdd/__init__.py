"""The free-spoken-digit-dataset (FSDD): where the bundled copy is, how its files are named, its words.

Shared by its recipe (prepare.py) and the benchmarks that split it themselves (bench/bench_loso.py).
"""

from __future__ import annotations

import re
from pathlib import Path

BUNDLED = Path(__file__).resolve().parents[2] / "corpora" / "free-spoken-digit-dataset"
WORDS = ("ZERO", "ONE", "TWO", "THREE", "FOUR", "FIVE", "SIX", "SEVEN", "EIGHT", "NINE")
NAME = re.compile(r"^([0-9])_([A-Za-z0-9]+)_([0-9]+)\.wav$")  # {digit}_{speaker}_{index}.wav


def speakers(corpus_dir: Path) -> list[str]:
    """The speakers of an FSDD recordings/ folder, sorted."""
    return sorted({m.group(2) for p in (corpus_dir / "recordings").iterdir() if (m := NAME.match(p.name))})
