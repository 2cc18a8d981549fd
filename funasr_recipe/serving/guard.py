"""What every request meets before a route runs: the API key, the declared size, a deadline for its
body, and its count and latency under its route's template (a label per route, not per raw path).

A pure ASGI middleware rather than FastAPI dependencies: the limits must hold while the body is read,
and FastAPI reads (and spools to disk) the whole form before any route or dependency runs, so a
chunked upload without Content-Length would be on disk before a route could count it. The bytes are
counted here, not by FastAPI's ``max_body_size`` (Starlette's RequestBodyLimitMiddleware): that one
replaces the answer to an over-size request with its own plain-text "Content Too Large", which the
openai client reports as a bare "Error code: 413" without the reason. Reads the API key file once,
at start-up; writes nothing.

  app.add_middleware(Guard, metrics=metrics, keys=load_api_keys(path), max_body=limit, ...)
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import stat
import time
from pathlib import Path

from funasr_recipe.core.rejections import BadInputError
from funasr_recipe.serving.errors import Refused, error_response
from funasr_recipe.serving.metrics import ServeMetrics

log = logging.getLogger(__name__)
API_KEY_ENV = "RECIPE_API_KEY"  # the key itself; an environment variable is not in `ps` as argv is
API_KEY_FILE_ENV = "RECIPE_API_KEY_FILE"
# Open without a key: liveness for load balancers, and the page with its assets (it sends the key
# the user types with each transcription).
OPEN_PATHS = ("/health", "/", "/favicon.ico")
OPEN_PREFIXES = ("/static/",)


def load_api_keys(path: Path | None) -> tuple[bytes, ...]:
    """The accepted keys: one per line of ``path`` (several for rotation; # comments), else the key in
    $RECIPE_API_KEY, else in the file $RECIPE_API_KEY_FILE names; () when none is configured.
    Raises BadInputError for an unreadable or empty key file."""
    path = path or (Path(os.environ[API_KEY_FILE_ENV]) if os.environ.get(API_KEY_FILE_ENV) else None)
    if path is None:
        key = os.environ.get(API_KEY_ENV, "").strip()
        return (key.encode(),) if key else ()
    try:
        text = path.read_text()
        mode = path.stat().st_mode
    except OSError as e:
        raise BadInputError(f"{path}: cannot read the API key file: {e}") from None
    keys = tuple(line.strip().encode() for line in text.splitlines()
                 if line.strip() and not line.lstrip().startswith("#"))
    if not keys:
        raise BadInputError(f"{path}: the API key file holds no key (one per line)")
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("%s: the API key file can be read by other users (chmod 600 it)", path)
    return keys


class Guard:
    """ASGI middleware: auth, the declared size, body time limits, per-route metrics, 500s in OpenAI's
    shape."""

    def __init__(self, app, metrics: ServeMetrics, keys: tuple[bytes, ...], max_body: int,
                 body_timeout_s: float, read_timeout_s: float) -> None:
        self.app, self.metrics, self.keys = app, metrics, keys
        self.max_body, self.body_timeout_s, self.read_timeout_s = max_body, body_timeout_s, read_timeout_s

    def _authorised(self, headers: dict[bytes, bytes]) -> bool:
        scheme, _, given = headers.get(b"authorization", b"").partition(b" ")
        given = given.strip()
        # Every key compared, each in constant time: neither the match nor its position leaks by timing.
        return scheme.lower() == b"bearer" and sum(hmac.compare_digest(given, k) for k in self.keys) > 0

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start, path = time.perf_counter(), scope["path"]
        headers = dict(scope["headers"])
        started = {"status": 0}

        async def reply(status: int, reason: str, message: str, extra: dict | None = None) -> None:
            self.metrics.errors.labels(reason).inc()
            await error_response(status, reason, message, extra)(scope, receive, send_)

        async def send_(message) -> None:
            if message["type"] == "http.response.start":
                started["status"] = message["status"]
            await send(message)

        received, waited, body_done = 0, 0.0, False

        async def receive_() -> dict:
            # Refusals raised here are HTTPExceptions, so that FastAPI's form parsing passes them on
            # rather than making them a 400 "error parsing the body"; errors.install answers them.
            nonlocal received, waited, body_done
            if body_done:
                # Starlette's FileResponse and StreamingResponse wait here for the client to hang up
                # while they send; a deadline would abort a response slower than read_timeout_s.
                return await receive()
            # The body's budget is spent only while waiting on the client. A deadline fixed when the
            # request came in also charged the app's own time before its first receive(): on a
            # loaded machine a GET's empty body, already in hand, timed out and cut the page off
            # after its headers. wait_for(…, 0) cancels even a ready message, so it is never asked.
            left = min(self.read_timeout_s, self.body_timeout_s - waited)
            since = time.monotonic()
            try:
                if left <= 0:
                    raise TimeoutError
                message = await asyncio.wait_for(receive(), left)
            except TimeoutError:
                raise Refused(408, "request_timeout", f"the upload did not arrive in time (a read "
                              f"waits {self.read_timeout_s:g} s, the whole body {self.body_timeout_s:g} s)")\
                    from None
            finally:
                waited += time.monotonic() - since
            received += len(message.get("body", b""))
            body_done = message["type"] != "http.request" or not message.get("more_body", False)
            if received > self.max_body:
                raise Refused(413, "too_large", f"upload over the limit of {self.max_body} bytes (counted "
                              "as it streamed in)")
            return message

        try:
            if self.keys and path not in OPEN_PATHS and not path.startswith(OPEN_PREFIXES) \
                    and not self._authorised(headers):
                await reply(401, "invalid_api_key", "a valid API key is required: send it as "
                            "'Authorization: Bearer <key>'", {"www-authenticate": "Bearer"})
                return
            length = headers.get(b"content-length", b"")
            if length.isdigit() and int(length) > self.max_body:
                await reply(413, "too_large", f"upload of {int(length)} bytes is over the limit of "
                            f"{self.max_body} bytes")
                return
            await self.app(scope, receive_, send_)
        except Exception:  # the route failed: a counted 500 with a reason, the traceback in the log
            log.exception("%s %s failed", scope["method"], path)
            if not started["status"]:
                await reply(500, "internal_error", "the server failed on this request; it is logged")
        finally:
            route = scope.get("route")
            endpoint = getattr(route, "path", None) or \
                ("/static" if path.startswith("/static/") else "unmatched")
            self.metrics.requests.labels(endpoint, str(started["status"] or 500)).inc()
            self.metrics.latency.labels(endpoint).observe(time.perf_counter() - start)
