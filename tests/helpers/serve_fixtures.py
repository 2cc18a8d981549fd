"""A real uvicorn server in a thread for the HTTP service's tests and its load benchmark."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn
from fastapi import FastAPI

from tests.helpers.train_fixtures import free_port


@contextmanager
def serving(app: FastAPI, timeout: float = 30.0, **config: Any) -> Iterator[str]:
    """``app`` served on a free 127.0.0.1 port for the block (``config``: more of uvicorn.Config's
    options); yields its base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", **config))
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"uvicorn did not start on port {port}")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout)
