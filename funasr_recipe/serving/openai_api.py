"""OpenAI's transcription API over the service's own transcription: POST /v1/audio/transcriptions and
GET /v1/models, as the official ``openai`` client calls them.

Fields OpenAI defines that greedy CTC decoding cannot honour are refused with a 400 naming them, not
accepted and ignored: a ``prompt``, a ``temperature`` other than 0, timestamps for a format that has
no place for them. A ``model`` other than the one served is a 404, as OpenAI answers an unknown model.
Reads nothing; writes nothing.

  client = openai.OpenAI(base_url="http://host:8000/v1", api_key=KEY)
  client.audio.transcriptions.create(model=NAME, file=f, response_format="verbose_json",
                                     timestamp_granularities=["word"])
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated

from fastapi import FastAPI, File, Form, UploadFile
from fastapi.responses import PlainTextResponse, Response

from funasr_recipe.serving import formats
from funasr_recipe.serving.errors import Refused

GRANULARITIES = ("segment", "word")


def add_routes(app: FastAPI, transcribe: Callable[[UploadFile, str, bool], Awaitable[dict]], name: str,
               model_file: Path, timed: bool) -> None:
    """The OpenAI routes on ``app``; ``transcribe(file, language, itn)`` gives the service's JSON, and
    ``timed`` says whether its tokens carry times (CTC families; Paraformer's do not)."""
    card = {"id": name, "object": "model", "created": int(model_file.stat().st_mtime),
            "owned_by": "funasr-recipe"}

    def known(model: str) -> None:
        if model != name:
            raise Refused(404, "model_not_found", f"the model {model!r} is not served here; GET /v1/models "
                          f"lists {name!r}", param="model")

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [card]}

    @app.get("/v1/models/{model}")
    async def model_card(model: str) -> dict:
        known(model)
        return card

    @app.post("/v1/audio/transcriptions", response_model=None)
    async def transcriptions(
            file: Annotated[UploadFile, File()], model: Annotated[str, Form()],
            language: Annotated[str | None, Form()] = None, response_format: Annotated[str, Form()] = "json",
            prompt: Annotated[str | None, Form()] = None, temperature: Annotated[float, Form()] = 0.0,
            granularities: Annotated[list[str] | None, Form(alias="timestamp_granularities[]")] = None,
            granularities_plain: Annotated[list[str] | None, Form(alias="timestamp_granularities")] = None,
    ) -> Response | dict:
        known(model)
        if response_format not in formats.FORMATS:
            raise Refused(400, "bad_format", f"response_format {response_format!r}: one of "
                          f"{', '.join(formats.FORMATS)}", param="response_format")
        if prompt:
            raise Refused(400, "unsupported_field", "prompt: this model decodes greedily and takes no "
                          "prompt", param="prompt")
        if temperature != 0:
            raise Refused(400, "unsupported_field", f"temperature {temperature:g}: this model decodes "
                          "greedily; only 0 is served", param="temperature")
        wanted = set((granularities or []) + (granularities_plain or []))
        if wanted - set(GRANULARITIES):
            raise Refused(400, "bad_granularity", f"timestamp_granularities {sorted(wanted)}: each one of "
                          f"{', '.join(GRANULARITIES)}", param="timestamp_granularities")
        if wanted and response_format != "verbose_json":
            raise Refused(400, "bad_granularity", "timestamp_granularities need response_format "
                          "verbose_json", param="timestamp_granularities")
        if "word" in wanted and not timed:
            raise Refused(400, "bad_granularity", "word timestamps: this model's family predicts tokens "
                          "without an alignment", param="timestamp_granularities")
        result = await transcribe(file, language or "auto", False)
        if response_format == "json":
            return {"text": result["text"]}
        if response_format == "verbose_json":
            body = {"task": "transcribe", "language": result["language"], "duration": result["duration"],
                    "text": result["text"]}
            if "segment" in wanted or not wanted:  # OpenAI's default granularity is segment
                body["segments"] = [{"id": i, **s} for i, s in enumerate(result["segments"])]
            if "word" in wanted:
                body["words"] = formats.words(result["tokens"])
            return body
        body = {"text": result["text"] + "\n", "srt": formats.srt(result), "vtt": formats.vtt(result)}
        media = "text/vtt" if response_format == "vtt" else "text/plain"
        return PlainTextResponse(body[response_format], media_type=media)
