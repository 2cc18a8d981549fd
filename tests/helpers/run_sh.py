"""run.sh as the tests start it: the repo root, a clean environment, one run and its options."""

from __future__ import annotations

import os
import subprocess
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
