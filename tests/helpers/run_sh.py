"""run.sh as the tests start it: the repo root, a clean environment, one run and its options."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


# Node options must come from the flags in these tests, not from the CI machine's environment.
CLEAN_ENV = {k: v for k, v in os.environ.items()
             if k not in ("NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT") and not k.startswith("SLURM_")}


def run_sh(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(["./run.sh", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**CLEAN_ENV, **(env or {})})


def dirs(tmp: Path) -> list[str]:
    return ["--data-dir", str(tmp / "data"), "--exp-dir", str(tmp / "exp")]


def venv_python() -> str:
    """The interpreter under the venv's real path, as path.sh's activate script runs it for run.sh: DeepSpeed
    JIT-builds its ops with the include paths of the interpreter's prefix, and two paths of one venv (the
    .venv link and its target) rebuild them each time they alternate (minutes for offload's CPU Adam)."""
    real = Path(sys.prefix).resolve() / "bin" / "python"
    return str(real) if sys.prefix != sys.base_prefix and real.is_file() else sys.executable
