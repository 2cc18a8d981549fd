"""Repository hygiene that review would otherwise have to catch: ruff, file sizes, shell syntax."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 400  # STYLE: no file over ~400 lines; split by responsibility instead


def tracked(*patterns: str) -> list[Path]:
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", *patterns],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [ROOT / p for p in out.splitlines() if (ROOT / p).is_file()]


def test_ruff_clean() -> None:
    res = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=ROOT,
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_no_file_over_400_lines() -> None:
    files = tracked("*.py", "*.sh") + [ROOT / "run.sh", ROOT / "path.sh", ROOT / ".ci" / "run"]
    big = {str(p.relative_to(ROOT)): n for p in set(files)
           if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not big, big


def test_shell_scripts_parse() -> None:
    for script in {*tracked("*.sh"), ROOT / "run.sh", ROOT / ".ci" / "run"}:
        res = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert res.returncode == 0, f"{script}: {res.stderr}"
