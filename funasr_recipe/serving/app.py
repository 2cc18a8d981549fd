"""The FastAPI app of the HTTP service: an exported model behind a transcription endpoint, its
OpenAI-compatible form, a web page, health and metrics.

Reads  an export dir through OnnxASR (stage 4's exp/<tag>/export or a package's onnx/) and
       serving/static/index.html; writes nothing (logs requests that fail).

  POST /v1/transcriptions        multipart: file, language (auto|zh|en|yue|ja|ko|nospeech), itn
                                 -> JSON: text, language, emotion, event, tokens (start/end s),
                                 segments, duration, processing_time
  POST /v1/audio/transcriptions  OpenAI's form: file, model, language, response_format
                                 (json|text|srt|vtt|verbose_json)
  GET  /  /health  /metrics      the page, liveness + model, Prometheus metrics

Audio of any rate and channel count that soundfile reads is downmixed and resampled with the training
resampler; audio over ``segment_s`` is split at pauses (serving/segmenter.py) and its pieces decoded
together. Bad input is a 4xx naming the reason, a full queue a 503 with Retry-After.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter as Tally
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated

import numpy as np
import torch
from fastapi import FastAPI, File, Form, HTTPException, Request, UploadFile
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from fastapi.staticfiles import StaticFiles

from funasr_recipe.features.audio import AudioError, decode_audio_bytes
from funasr_recipe.features.fbank import mono_at_rate
from funasr_recipe.runtime.onnx_asr import OnnxASR
from funasr_recipe.serving import formats
from funasr_recipe.serving.batcher import DynamicBatcher, QueueFull
from funasr_recipe.serving.engine import Engine, Piece, PieceResult
from funasr_recipe.serving.metrics import ServeMetrics
from funasr_recipe.serving.segmenter import split_at_pauses

log = logging.getLogger(__name__)
STATIC = Path(__file__).parent / "static"  # the web page: index.html, style.css, app.js
PAGE = STATIC / "index.html"
# The status of each refusal of funasr_recipe.features.audio's reasons.
AUDIO_STATUS = {"empty_file": 400, "unreadable_audio": 415, "truncated_audio": 400, "empty_audio": 400}
AUDIO_MESSAGE = {"empty_file": "empty upload", "unreadable_audio": "not an audio file that can be read",
                 "truncated_audio": "truncated audio file", "empty_audio": "zero-length audio"}
FORM_OVERHEAD = 64 * 1024  # multipart boundaries and the other fields, beside the file itself


@dataclass
class ServeSettings:
    max_batch: int = 8  # pieces decoded in one onnxruntime call
    max_wait_ms: float = 10.0  # how long the first piece of a batch waits for others
    queue_size: int = 64  # pieces waiting; beyond it requests get 503
    max_upload_mb: float = 25.0  # OpenAI's own limit
    max_duration_s: float = 600.0  # of audio per request
    segment_s: float = 30.0  # longer audio is split at pauses into pieces of at most this
    retry_after_s: int = 1  # Retry-After of a 503


class Refused(HTTPException):
    """A request refused for a reason that is counted in the metrics."""

    def __init__(self, status: int, reason: str, detail: str, headers: dict | None = None) -> None:
        super().__init__(status, detail, headers)
        self.reason = reason


def create_app(asr: OnnxASR, settings: ServeSettings | None = None, model_name: str | None = None) -> FastAPI:
    """The app over a loaded runtime (the model is loaded before the port opens)."""
    settings = settings or ServeSettings()
    engine = Engine(asr)
    # exp/<tag>/export and <package>/onnx are named by the dir above them.
    named = asr.dir.resolve()
    name = model_name or (named.parent.name if named.name in ("export", "onnx") else named.name)
    batcher_box: list[DynamicBatcher] = []
    metrics = ServeMetrics(lambda: batcher_box[0].depth if batcher_box else 0)
    # One torch thread in the worker: onnxruntime has the cores (runtime/onnx_asr.py says why).
    batcher = DynamicBatcher(engine.decode, settings.max_batch, settings.max_wait_ms, settings.queue_size,
                             on_batch=metrics.on_batch, thread_init=lambda: torch.set_num_threads(1))
    batcher_box.append(batcher)
    limit = int(settings.max_upload_mb * 2**20)

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        yield
        batcher.close()

    app = FastAPI(title="funasr-recipe ASR", lifespan=lifespan,
                  description=f"{engine.family} ({asr.model_file.name}) from {asr.dir}")
    app.state.batcher, app.state.metrics, app.state.engine = batcher, metrics, engine

    @app.middleware("http")
    async def count(request: Request, call_next):
        start = time.perf_counter()
        length = request.headers.get("content-length")
        if request.method == "POST" and length and length.isdigit() and int(length) > limit + FORM_OVERHEAD:
            metrics.errors.labels("too_large").inc()
            response: Response = JSONResponse(
                {"detail": f"upload of {int(length)} bytes is over the limit of {limit} bytes"}, 413)
        else:
            response = await call_next(request)
        path = request.url.path
        if path.startswith("/v1/"):
            metrics.requests.labels(path, str(response.status_code)).inc()
            metrics.latency.labels(path).observe(time.perf_counter() - start)
        return response

    @app.exception_handler(Refused)
    async def refused(_: Request, e: Refused) -> JSONResponse:
        metrics.errors.labels(e.reason).inc()
        if e.status_code >= 500:
            log.warning("refused: %s", e.detail)
        return JSONResponse({"detail": e.detail}, e.status_code, headers=e.headers)

    async def prepare(file: UploadFile, max_s: float) -> tuple[np.ndarray, int, np.ndarray, list]:
        """(audio as uploaded, its rate, mono at the model's rate, pieces' sample ranges); Refused."""
        data = await file.read(limit + 1)
        if len(data) > limit:
            raise Refused(413, "too_large", f"upload over the limit of {limit} bytes")
        try:
            wave, rate = await run_in_threadpool(decode_audio_bytes, data, file.filename or "upload")
        except AudioError as e:
            raise Refused(AUDIO_STATUS.get(e.reason, 400), e.reason,
                          f"{AUDIO_MESSAGE.get(e.reason, e.reason)}: {e.detail}") from None
        if wave.shape[0] / rate > max_s:
            raise Refused(413, "too_long", f"{wave.shape[0] / rate:.1f} s of audio is over the limit of "
                          f"{max_s:g} s")
        mono = await run_in_threadpool(mono_at_rate, wave, rate, engine.fs)
        return wave, rate, mono, split_at_pauses(mono, engine.fs, settings.segment_s)

    async def transcribe(file: UploadFile, language: str, itn: bool) -> dict:
        start = time.perf_counter()
        language = (language or "auto").strip().lower()
        if language not in engine.languages:
            raise Refused(400, "unknown_language", f"unknown language {language!r}: this model "
                          f"({engine.family}) takes {', '.join(engine.languages)}")
        with batcher.expect():
            wave, rate, mono, ranges = await prepare(file, settings.max_duration_s)
            textnorm = "withitn" if itn else "woitn"
            pieces = [Piece(mono[a:b], a / engine.fs, language, textnorm) for a, b in ranges]
            try:
                future = batcher.submit(pieces)
            except QueueFull as e:
                raise Refused(503, "queue_full", f"busy: {e}; retry later",
                              {"Retry-After": str(settings.retry_after_s)}) from None
        duration = wave.shape[0] / rate
        results: list[PieceResult] = await asyncio.wrap_future(future)
        metrics.audio_seconds.inc(duration)
        return answer(results, ranges, engine.fs, duration, rate, wave.shape[1], itn,
                      time.perf_counter() - start)

    @app.post("/v1/transcriptions")
    async def transcriptions(file: Annotated[UploadFile, File()], language: Annotated[str, Form()] = "auto",
                             itn: Annotated[bool, Form()] = False) -> dict:
        return await transcribe(file, language, itn)

    @app.post("/v1/audio/transcriptions", response_model=None)
    async def openai_transcriptions(file: Annotated[UploadFile, File()], model: Annotated[str, Form()] = name,
                                    language: Annotated[str | None, Form()] = None,
                                    response_format: Annotated[str, Form()] = "json",
                                    prompt: Annotated[str | None, Form()] = None,
                                    temperature: Annotated[float, Form()] = 0.0) -> Response | dict:
        # prompt and temperature are accepted for OpenAI clients' sake; greedy CTC uses neither.
        if response_format not in formats.FORMATS:
            raise Refused(400, "bad_format", f"response_format {response_format!r}: one of "
                          f"{', '.join(formats.FORMATS)}")
        result = await transcribe(file, language or "auto", False)
        if response_format == "json":
            return {"text": result["text"]}
        if response_format == "verbose_json":
            return {"task": "transcribe", "language": result["language"], "duration": result["duration"],
                    "text": result["text"], "model": model,
                    "segments": [{"id": i, **s} for i, s in enumerate(result["segments"])]}
        body = {"text": result["text"] + "\n", "srt": formats.srt(result), "vtt": formats.vtt(result)}
        media = "text/vtt" if response_format == "vtt" else "text/plain"
        return PlainTextResponse(body[response_format], media_type=media)

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "model": name, "family": engine.family, "file": asr.model_file.name,
                "sample_rate": engine.fs, "languages": list(engine.languages), "queue_depth": batcher.depth,
                "settings": asdict(settings)}

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/", include_in_schema=False)
    async def page() -> Response:
        if not PAGE.is_file():
            return PlainTextResponse(f"no page at {PAGE}", 404)
        return FileResponse(PAGE, media_type="text/html")

    return app


def answer(results: list[PieceResult], ranges: list[tuple[int, int]], fs: int, duration: float, rate: int,
           channels: int, itn: bool, seconds: float) -> dict:
    """The JSON of one transcription from its pieces' results (the tags: the most frequent per kind)."""
    tags = {}
    for kind in ("language", "emotion", "event"):
        seen = Tally(r.tags[kind] for r in results if r.tags.get(kind))
        tags[kind] = seen.most_common(1)[0][0] if seen else None
    return {
        "text": " ".join(r.text for r in results if r.text), **tags, "itn": itn,
        "tokens": [asdict(t) for r in results for t in r.tokens],
        "segments": [{"start": round(a / fs, 3), "end": round(b / fs, 3), "text": r.text}
                     for (a, b), r in zip(ranges, results, strict=True)],
        "duration": round(duration, 3), "sample_rate": rate, "channels": channels,
        "processing_time": round(seconds, 4)}
