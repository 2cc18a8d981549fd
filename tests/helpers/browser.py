"""Helpers for tests that drive the HTTP service: the server as a subprocess, and headless Chromium.

``served(export_dir, log)`` runs ``python -m local.serve`` on a free 127.0.0.1 port, writes its output to
``log``, waits (bounded) for GET /health to answer 200 {"status": "ok"} and yields the base URL; it
always terminates the server. ``chromium()`` yields a playwright Browser (Debian's /usr/bin/chromium,
headless, fresh profile), or skips the test with the reason when either is missing.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest

from tests.helpers.train_fixtures import free_port

if TYPE_CHECKING:
    from playwright.sync_api import Browser

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 # A synthetic microphone (a beep) granted without a prompt: the page's recorder has input.
                 "--use-fake-device-for-media-stream", "--use-fake-ui-for-media-stream"]


def server_command(export_dir: Path, port: int) -> list[str]:
    return [sys.executable, "-m", "local.serve", "--model-dir", str(export_dir), "--host", "127.0.0.1",
            "--port", str(port)]


def wait_healthy(url: str, proc: subprocess.Popen, log: Path, timeout: float) -> None:
    """Return once GET url/health is 200 {"status": "ok"}; fail with the server's log if it exits first
    or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"server exited with {proc.returncode}:\n{log.read_text(errors='replace')[-3000:]}")
        with contextlib.suppress(httpx.HTTPError):
            res = httpx.get(f"{url}/health", timeout=2)
            if res.status_code == 200 and res.json().get("status") == "ok":
                return
        time.sleep(0.3)
    pytest.fail(f"no healthy /health in {timeout:.0f} s:\n{log.read_text(errors='replace')[-3000:]}")


@contextlib.contextmanager
def served(export_dir: Path, log: Path, timeout: float = 120) -> Iterator[str]:
    """The base URL of ``python -m local.serve`` on ``export_dir``, healthy; terminated on exit."""
    port = free_port()
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}
    with log.open("wb") as out:
        proc = subprocess.Popen(server_command(export_dir, port), cwd=ROOT, env=env, stdout=out,
                                stderr=subprocess.STDOUT)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_healthy(url, proc, log, timeout)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@contextlib.contextmanager
def chromium() -> Iterator[Browser]:
    """A headless Chromium through playwright's sync API; skips when Chromium or playwright is missing."""
    if not CHROMIUM.is_file():
        pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    with sync_api.sync_playwright() as pw:
        # launch() gives the browser a fresh temporary --user-data-dir and removes it on close.
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()
