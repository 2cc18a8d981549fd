"""The docs' shell blocks, for the tests that check and run them (tests/unit/repo/test_docs.py,
tests/e2e/test_docs_commands.py)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNNABLE = "<!-- runnable -->"


def doc_files() -> list[Path]:
    """Every markdown file the site shows or includes, and the README."""
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), ROOT / "bench" / "README.md",
             *sorted((ROOT / "recipes").glob("*/RESULTS.md")), ROOT / "slurm" / "README.md"]
    return [f for f in files if f.is_file()]


def shell_blocks(path: Path) -> list[tuple[int, bool, str]]:
    """(line of the fence, marked runnable, text) of every ```bash block of a markdown file."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        if lines[i].strip() in ("```bash", "```sh", "```shell"):
            start = i
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
            runnable = start > 0 and lines[start - 1].strip() == RUNNABLE
            blocks.append((start + 1, runnable, "\n".join(lines[start + 1:end])))
            i = end
        i += 1
    return blocks
