"""The FastAPI app of the HTTP service: an exported model behind a transcription endpoint, its
OpenAI-compatible form, a web page, health and metrics.

Reads  an export dir through OnnxASR (stage 4's exp/<tag>/export or a package's onnx/) and
       serving/static/index.html; writes nothing (logs requests that fail).

  POST /v1/transcriptions        multipart: file, language (auto|zh|en|yue|ja|ko|nospeech), itn
                                 -> JSON: text, language, emotion, event, tokens (start/end s),
                                 segments, duration, processing_time
  POST /v1/audio/transcriptions  OpenAI's form (serving/openai_api.py); GET /v1/models
  GET  /  /health  /metrics      the page, liveness + model, Prometheus metrics

With API keys configured, every route but /health and the page needs ``Authorization: Bearer <key>``
(serving/guard.py). Limits hold before the work they guard: the declared size before the body is
read, the streamed size while it is (serving/guard.py), the rate and duration from the header before
decoding (serving/upload.py). Audio of any rate and channel count is downmixed and resampled
with the training resampler; audio over ``segment_s`` is split at pauses (serving/segmenter.py) and
its pieces decoded together; a piece of digital silence is not decoded (a CTC model trained on
speech hallucinates a word on it). Every refusal is a 4xx/5xx in OpenAI's error shape, counted by
reason (serving/errors.py); a full queue is a 503 with Retry-After.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import Counter as Tally
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated

import numpy as np
from fastapi import FastAPI, File, Form, UploadFile
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse, PlainTextResponse, Response
from fastapi.staticfiles import StaticFiles

from funasr_recipe.core.rejections import BadInputError
from funasr_recipe.features.audio import AudioError
from funasr_recipe.features.numpy_fbank import mono_at_rate
from funasr_recipe.runtime.onnx_asr import OnnxASR, export_name
from funasr_recipe.serving import errors, openai_api
from funasr_recipe.serving.batcher import DynamicBatcher, QueueFull
from funasr_recipe.serving.engine import Engine, Piece, PieceResult
from funasr_recipe.serving.errors import Refused
from funasr_recipe.serving.guard import Guard
from funasr_recipe.serving.metrics import ServeMetrics
from funasr_recipe.serving.segmenter import split_at_pauses
from funasr_recipe.serving.upload import read_upload

log = logging.getLogger(__name__)
STATIC = Path(__file__).parent / "static"  # the web page: index.html, style.css, app.js
PAGE = STATIC / "index.html"
# The status of each refusal of serving/upload.py's reasons.
AUDIO_STATUS = {"empty_file": 400, "unreadable_audio": 415, "truncated_audio": 400, "empty_audio": 400,
                "bad_sample_rate": 400, "too_long": 413, "non_finite_audio": 400}
AUDIO_MESSAGE = {"empty_file": "empty upload", "unreadable_audio": "not an audio file that can be read",
                 "truncated_audio": "truncated audio file", "empty_audio": "zero-length audio",
                 "bad_sample_rate": "implausible sample rate", "too_long": "too long",
                 "non_finite_audio": "samples that are not numbers"}
FORM_OVERHEAD = 64 * 1024  # multipart boundaries and the other fields, beside the file itself
# A piece whose loudest sample is below this (-80 dBFS; a 16-bit file's least step is -90) holds no
# sound to transcribe: digital silence, or a muted microphone.
SILENT_PEAK = 1e-4


@dataclass
class ServeSettings:
    """The service's limits; each is an option of local/serve.py, ``help`` its --help line."""

    max_batch: int = field(default=8, metadata={"help": "pieces decoded in one onnxruntime call"})
    max_wait_ms: float = field(default=10.0, metadata={
        "help": "milliseconds the first piece of a batch waits for others"})
    queue_size: int = field(default=64, metadata={"help": "pieces waiting; beyond it requests get 503"})
    max_upload_mb: float = field(default=25.0, metadata={"help": "MB per upload (OpenAI's own limit)"})
    max_duration_s: float = field(default=600.0, metadata={"help": "seconds of audio per request"})
    segment_s: float = field(default=30.0, metadata={
        "help": "longer audio is split at pauses into pieces of at most this many seconds"})
    retry_after_s: int = field(default=1, metadata={"help": "Retry-After of a 503, seconds"})
    header_timeout_s: float = field(default=10.0, metadata={
        "help": "seconds within which a request's headers must all arrive"})
    read_timeout_s: float = field(default=30.0, metadata={
        "help": "the longest wait for the next piece of a body, seconds"})
    body_timeout_s: float = field(default=300.0, metadata={
        "help": "seconds for the whole body (25 MB at 0.7 Mb/s)"})
    max_connections: int = field(default=512, metadata={"help": "open connections; more are closed at once"})

    def check(self) -> None:
        """Refuse settings that cannot work (BadInputError), before the port opens."""
        if self.segment_s <= 0 or self.max_duration_s <= 0:
            raise BadInputError("--segment-s and --max-duration-s must be positive")
        pieces = math.ceil(self.max_duration_s / self.segment_s)
        if pieces > self.queue_size:
            # Such a request could never enter the queue: a 503 "retry later" for ever.
            raise BadInputError(f"--max-duration-s {self.max_duration_s:g} in pieces of --segment-s "
                                f"{self.segment_s:g} is {pieces} pieces, more than --queue-size "
                                f"{self.queue_size}: raise --queue-size to {pieces} or --segment-s to "
                                f"{self.max_duration_s / self.queue_size:g}")


def create_app(asr: OnnxASR, settings: ServeSettings | None = None, model_name: str | None = None,
               api_keys: tuple[bytes, ...] = ()) -> FastAPI:
    """The app over a loaded runtime (the model is loaded before the port opens)."""
    settings = settings or ServeSettings()
    settings.check()
    engine = Engine(asr)
    name = model_name or export_name(asr.dir)
    batcher_box: list[DynamicBatcher] = []
    metrics = ServeMetrics(lambda: batcher_box[0].depth if batcher_box else 0)
    batcher = DynamicBatcher(engine.decode, settings.max_batch, settings.max_wait_ms, settings.queue_size,
                             on_batch=metrics.on_batch)
    batcher_box.append(batcher)
    limit = int(settings.max_upload_mb * 2**20)

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        yield
        batcher.close()

    # No /docs: Swagger UI loads from a CDN, which a service off the internet cannot reach; the schema
    # stays at /openapi.json, naming the model's family, not its path on this machine.
    app = FastAPI(title="funasr-recipe ASR", lifespan=lifespan, docs_url=None, redoc_url=None,
                  description=f"{engine.family} speech recognition")
    app.state.batcher, app.state.metrics, app.state.engine = batcher, metrics, engine
    errors.install(app, metrics)
    app.add_middleware(Guard, metrics=metrics, keys=api_keys, max_body=limit + FORM_OVERHEAD,
                       body_timeout_s=settings.body_timeout_s, read_timeout_s=settings.read_timeout_s)

    async def prepare(file: UploadFile) -> tuple[np.ndarray, int, np.ndarray, list]:
        """(audio as uploaded, its rate, mono at the model's rate, pieces' sample ranges); Refused."""
        data = await file.read(limit + 1)
        if len(data) > limit:
            raise Refused(413, "too_large", f"upload over the limit of {limit} bytes")
        try:
            wave, rate = await run_in_threadpool(read_upload, data, file.filename or "upload",
                                                 settings.max_duration_s)
        except AudioError as e:
            raise Refused(AUDIO_STATUS.get(e.reason, 400), e.reason,
                          f"{AUDIO_MESSAGE.get(e.reason, e.reason)}: {e.detail}", param="file") from None
        mono = await run_in_threadpool(mono_at_rate, wave, rate, engine.fs)
        return wave, rate, mono, split_at_pauses(mono, engine.fs, settings.segment_s)

    async def transcribe(file: UploadFile, language: str, itn: bool) -> dict:
        start = time.perf_counter()
        language = (language or "auto").strip().lower()
        if language not in engine.languages:
            raise Refused(400, "unknown_language", f"unknown language {language!r}: this model "
                          f"({engine.family}) takes {', '.join(engine.languages)}", param="language")
        with batcher.expect():
            wave, rate, mono, ranges = await prepare(file)
            textnorm = "withitn" if itn else "woitn"
            pieces = [Piece(mono[a:b], a / engine.fs, language, textnorm) for a, b in ranges]
            sound = [i for i, p in enumerate(pieces) if p.samples and np.abs(p.wave).max() >= SILENT_PEAK]
            if len(sound) > settings.queue_size:  # it could never enter the queue: not a "retry later"
                raise Refused(413, "too_many_pieces", f"{len(sound)} pieces of at most {settings.segment_s:g}"
                              f" s are more than the queue holds ({settings.queue_size})")
            try:
                future = batcher.submit([pieces[i] for i in sound])
            except QueueFull as e:
                raise Refused(503, "queue_full", f"busy: {e}; retry later",
                              {"Retry-After": str(settings.retry_after_s)}) from None
        duration = wave.shape[0] / rate
        decoded: list[PieceResult] = await asyncio.wrap_future(future)
        results = [PieceResult("") for _ in pieces]
        for i, result in zip(sound, decoded, strict=True):
            results[i] = result
        metrics.audio_seconds.inc(duration)
        return answer(results, ranges, engine.fs, duration, rate, wave.shape[1], itn,
                      time.perf_counter() - start)

    @app.post("/v1/transcriptions")
    async def transcriptions(file: Annotated[UploadFile, File()], language: Annotated[str, Form()] = "auto",
                             itn: Annotated[bool, Form()] = False) -> dict:
        return await transcribe(file, language, itn)

    openai_api.add_routes(app, transcribe, name, asr.model_file, engine.spec.ctc)

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "model": name, "family": engine.family, "file": asr.model_file.name,
                "sample_rate": engine.fs, "languages": list(engine.languages), "queue_depth": batcher.depth,
                "auth": "bearer" if api_keys else None, "settings": asdict(settings)}

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
