"""core/env.py's recipe_env: path.sh's environment for a program started without it."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from funasr_recipe.core.env import recipe_env

ROOT = Path(__file__).resolve().parents[3]


def test_recipe_env_is_path_sh_for_a_shell_that_never_sourced_it() -> None:
    if not (ROOT / ".venv" / "bin" / "python").exists():
        pytest.skip("no .venv: ./setup.sh makes it")
    bare = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp")}
    env = recipe_env(ROOT, bare)
    venv_bin = Path(env["PATH"].split(os.pathsep)[0])
    assert venv_bin.resolve() == (ROOT / ".venv" / "bin").resolve()
    # What bench/bench_train.py's torchrun and DeepSpeed's op build look up by name.
    assert shutil.which("ninja", path=env["PATH"]) and shutil.which("torchrun", path=env["PATH"])
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(ROOT)
    assert env["OMP_NUM_THREADS"] == "1" and env["TORCH_EXTENSIONS_DIR"].endswith("torch_extensions")
    # The caller's own settings are kept, as path.sh keeps them.
    assert recipe_env(ROOT, {**bare, "OMP_NUM_THREADS": "4"})["OMP_NUM_THREADS"] == "4"
