"""Helpers of the fault suite: run.sh started as its own process group (as a terminal or a scheduler
starts it), its stderr in a file, and waits on what it writes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

from tests.helpers.run_sh import CLEAN_ENV, ROOT


def start_run_sh(*args: str, stderr: Path, env: dict | None = None,
                 umask: str | None = None) -> subprocess.Popen:
    """run.sh in a session of its own; stderr to a file (a pipe nobody reads would block it)."""
    cmd = ["./run.sh", *args]
    if umask is not None:
        cmd = ["bash", "-c", f'umask {umask}; exec ./run.sh "$@"', "run.sh", *args]
    with open(stderr, "w") as err:
        return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err, text=True,
                                env={**CLEAN_ENV, **(env or {})}, start_new_session=True,
                                preexec_fn=_terminal_signals)


def _terminal_signals() -> None:
    """SIGINT and SIGQUIT as a terminal delivers them. A test run started in the background by a
    non-interactive shell (`cmd &`) inherits them ignored, and an ignored signal stays ignored in
    every child, trap or not: the Ctrl-C fault would then test nothing (seen: run.sh ran on to rc 0)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


def wait_for(condition, what: str, proc: subprocess.Popen | None = None, timeout: float = 600,
             poll: float = 0.2) -> None:
    """Poll ``condition()`` until true; fail naming ``what`` on timeout, or if ``proc`` ended first."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc is None or proc.poll() is None, f"run.sh ended (exit {proc.returncode}) before {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(poll)


def log_has(path: Path, pattern: str) -> bool:
    return path.exists() and re.search(pattern, path.read_text(errors="replace")) is not None


def processes_with(*needles: str, env_has: str | None = None) -> list[int]:
    """Live (not zombie) processes whose command line holds every needle (and whose environment holds
    ``env_has``, e.g. NODE_RANK=1)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (proc / "stat").read_text().rsplit(") ", 1)[1][0]
            environ = (proc / "environ").read_bytes().split(b"\0") if env_has else []
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if state == "Z" or not all(n in cmdline for n in needles):
            continue
        if env_has and env_has.encode() not in environ:
            continue
        found.append(int(proc.name))
    return found
