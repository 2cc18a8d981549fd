"""Every shell block the docs mark runnable (``<!-- runnable -->`` right above its fence) runs as written
in a fresh copy of the repository: the tracked files and the venv, nothing a developer left behind. Paths
under /tmp/ are moved into the test's own directory, so that parallel runs do not meet."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers.doc_blocks import ROOT, doc_files, shell_blocks

BLOCKS = [(path, line, text) for path in doc_files()
          for line, runnable, text in shell_blocks(path) if runnable]


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tracked tree, as a fresh clone has it, with the venv linked."""
    dest = tmp_path_factory.mktemp("clone")
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for rel in filter(None, tracked.decode().split("\0")):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    (dest / ".venv").symlink_to((ROOT / ".venv").resolve())
    return dest


@pytest.mark.parametrize(("path", "line", "text"), BLOCKS,
                         ids=[f"{p.relative_to(ROOT)}:{n}" for p, n, _ in BLOCKS])
def test_runnable_block(clone: Path, tmp_path: Path, path: Path, line: int, text: str) -> None:
    script = text.replace("/tmp/", f"{tmp_path}/")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHONPATH"))}
    res = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=clone, capture_output=True,
                         text=True, timeout=600, env=env)
    where = f"{path.relative_to(ROOT)}:{line}"
    assert res.returncode == 0, f"{where}\n{script}\n{res.stdout[-2000:]}{res.stderr[-4000:]}"
