"""Run a command with its output in a log file: how the benchmarks drive run.sh and other programs.

Reads nothing; writes the log file (and whatever the command writes).

  rc, seconds = run_logged(["./run.sh", "--stop-stage", "3"], Path("exp/x/run.log"), cwd=repo)
"""

from __future__ import annotations

import logging
import shlex
import subprocess
import time
from pathlib import Path

log = logging.getLogger(__name__)


def run_logged(cmd: list[str], log_file: Path, cwd: Path) -> tuple[int, float]:
    """(exit status, wall seconds) of ``cmd`` run in ``cwd``, its stdout and stderr in ``log_file``."""
    log.info("%s  (log in %s)", shlex.join(cmd), log_file)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with open(log_file, "w", encoding="utf-8") as out:
        rc = subprocess.run(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT).returncode
    return rc, time.monotonic() - start
