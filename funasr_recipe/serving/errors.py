"""Errors of the HTTP service, in the shape OpenAI's API answers them, so that its clients (the official
``openai`` package raises ``APIStatusError`` with ``.message`` and ``.code`` taken from it) and curl
users both see the reason, and every error is counted under that reason.

Reads and writes nothing; ``install`` registers the handlers on the app:

  {"error": {"message": "upload over the limit of 1048576 bytes", "type": "invalid_request_error",
             "code": "too_large", "param": null}}
"""

from __future__ import annotations

import logging
from http import HTTPStatus

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from funasr_recipe.serving.metrics import ServeMetrics

log = logging.getLogger(__name__)
# The reasons of Starlette's own refusals (routing, methods), by status.
STATUS_REASON = {404: "not_found", 405: "method_not_allowed", 413: "too_large", 401: "unauthorized"}


class Refused(HTTPException):
    """A request refused for a reason that is counted in the metrics and named in the answer."""

    def __init__(self, status: int, reason: str, detail: str, headers: dict | None = None,
                 param: str | None = None) -> None:
        super().__init__(status, detail, headers)
        self.reason, self.param = reason, param


def error_type(status: int) -> str:
    """OpenAI's ``type`` for a status: who should change what."""
    if status == 401:
        return "authentication_error"
    return "invalid_request_error" if status < 500 else "server_error"


def error_body(status: int, reason: str, message: str, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": error_type(status), "code": reason, "param": param}}


def error_response(status: int, reason: str, message: str, headers: dict | None = None,
                   param: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, reason, message, param), status, headers=headers)


def install(app: FastAPI, metrics: ServeMetrics) -> None:
    """Answer every refusal FastAPI or the routes raise in OpenAI's shape, counted by reason."""

    @app.exception_handler(Refused)
    async def refused(_: Request, e: Refused) -> JSONResponse:
        metrics.errors.labels(e.reason).inc()
        if e.status_code >= 500:
            log.warning("refused: %s", e.detail)
        return error_response(e.status_code, e.reason, str(e.detail), e.headers, e.param)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, e: StarletteHTTPException) -> JSONResponse:
        reason = STATUS_REASON.get(e.status_code, HTTPStatus(e.status_code).phrase.lower().replace(" ", "_"))
        metrics.errors.labels(reason).inc()
        return error_response(e.status_code, reason, str(e.detail), getattr(e, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, e: RequestValidationError) -> JSONResponse:
        # A missing file, a form field of the wrong type: name the field and what is wrong with it.
        problems = e.errors()
        fields = [".".join(str(p) for p in err.get("loc", ())[1:]) or "request" for err in problems]
        message = "; ".join(f"{f}: {err.get('msg', 'invalid')}"
                            for f, err in zip(fields, problems, strict=True))
        metrics.errors.labels("invalid_request").inc()
        return error_response(400, "invalid_request", message or "invalid request",
                              param=fields[0] if fields else None)
