"""The documentation: the site builds with warnings as errors (broken links, anchors, missing included
files, pages left out of the navigation), the README stays a short tour, and every shell command the
docs show can run from a fresh clone as written (the runnable ones are run by
tests/e2e/test_docs_commands.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.doc_blocks import ROOT, RUNNABLE, doc_files, shell_blocks

README_MAX_LINES = 200
# Commands shown for another machine's environment, where `python` is that environment's: the package's
# runtime installed alone (docs/deployment.md, docs/serving.md).
OTHER_MACHINE = re.compile(r"PYTHONPATH=runtime python|python -m funasr_recipe\.runtime\.transcribe|"
                           r"python -c \"import secrets")


def test_readme_is_a_short_tour() -> None:
    n = len((ROOT / "README.md").read_text(encoding="utf-8").splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines: move the detail into a page of docs/"


def test_commands_use_the_venvs_python() -> None:
    """A bare ``python`` is not the recipe's environment on a fresh clone (no venv activated): every
    command runs `.venv/bin/python` or a program that sources path.sh (run.sh)."""
    bare = []
    for path in doc_files():
        for line_no, _, text in shell_blocks(path):
            for offset, line in enumerate(text.splitlines(), 1):
                if re.search(r"(^|[\s;&|(])python3? ", line) and not OTHER_MACHINE.search(line):
                    bare.append(f"{path.relative_to(ROOT)}:{line_no + offset}: {line.strip()}")
    assert not bare, "bare python in the docs' commands:\n" + "\n".join(bare)


def test_some_commands_are_marked_runnable() -> None:
    marked = [(p, n) for p in doc_files() for n, runnable, _ in shell_blocks(p) if runnable]
    assert len(marked) >= 5, marked
    text = "\n".join(p.read_text(encoding="utf-8") for p in doc_files())
    assert text.count(RUNNABLE) == len(marked), f"a {RUNNABLE} mark not right above a ```bash fence"


def test_the_site_builds_with_warnings_as_errors(tmp_path: Path) -> None:
    """mkdocs build --strict, the reference pages generated from the programs' --help included."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    res = subprocess.run([str(Path(sys.executable).with_name("mkdocs")), "build", "--strict", "--site-dir",
                          str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True, env=env,
                         timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-6000:]
    run_sh = (tmp_path / "site" / "reference" / "run_sh" / "index.html").read_text(encoding="utf-8")
    assert "--stop-stage" in run_sh and "--pretrained-dir" in run_sh
    programs = (tmp_path / "site" / "reference" / "programs" / "index.html").read_text(encoding="utf-8")
    for program in sorted((ROOT / "local").glob("*.py")):
        if program.stem != "__init__":
            assert f"local.{program.stem}" in programs, f"local/{program.name} has no reference entry"


@pytest.mark.parametrize("page", ["getting-started.md", "your-data.md", "configs.md", "finetuning.md",
                                  "cluster.md", "monitoring.md", "reliability.md", "serving.md",
                                  "deployment.md", "performance.md", "troubleshooting.md", "architecture.md"])
def test_a_page_per_topic(page: str) -> None:
    text = (ROOT / "docs" / page).read_text(encoding="utf-8")
    assert text.startswith("# ") and len(text.splitlines()) > 5
