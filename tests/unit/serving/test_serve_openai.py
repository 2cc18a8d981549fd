"""The service through the official ``openai`` client (issue #32, item 4): every response format, word
timestamps, /v1/models, and the reason of a refusal in the client's exception; the recordings browsers
and phones make (WebM/Opus, M4A/AAC)."""

from __future__ import annotations

import io
from collections.abc import Iterator

import httpx
import openai
import pytest

from funasr_recipe.runtime.onnx_asr import OnnxASR
from funasr_recipe.serving import formats
from funasr_recipe.serving.app import ServeSettings, create_app
from tests.helpers.serve_app import TEXT, encoded, recorded, tone
from tests.helpers.serve_fixtures import serving

KEY = "sk-openai-test"


@pytest.fixture(scope="module")
def url(asr: OnnxASR) -> Iterator[str]:
    app = create_app(asr, ServeSettings(max_upload_mb=1.0, max_duration_s=40.0, segment_s=8.0),
                     "peaked", (KEY.encode(),))
    with serving(app) as base:
        yield base


@pytest.fixture(scope="module")
def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)


def clip(name: str = "a.wav", seconds: float = 2.0, fs: int = 16000) -> tuple[str, bytes]:
    return name, encoded(tone(seconds, fs), fs)


def test_every_response_format(client: openai.OpenAI) -> None:
    create = client.audio.transcriptions.create
    assert create(model="peaked", file=clip()).text == TEXT
    assert create(model="peaked", file=clip(), response_format="text") == TEXT + "\n"
    srt = create(model="peaked", file=clip(), response_format="srt")
    assert srt == f"1\n00:00:00,000 --> 00:00:02,000\n{TEXT}\n"
    vtt = create(model="peaked", file=clip(), response_format="vtt")
    assert vtt == f"WEBVTT\n\n00:00:00.000 --> 00:00:02.000\n{TEXT}\n"
    verbose = create(model="peaked", file=clip(), response_format="verbose_json", language="en")
    assert verbose.text == TEXT and verbose.duration == 2.0 and verbose.language == "en"
    assert [(s.id, s.start, s.end, s.text) for s in verbose.segments] == [(0, 0.0, 2.0, TEXT)]


def test_word_timestamps(client: openai.OpenAI) -> None:
    verbose = client.audio.transcriptions.create(model="peaked", file=clip(), response_format="verbose_json",
                                                 timestamp_granularities=["word"])
    words = verbose.words
    assert [w.word for w in words] == TEXT.split() and verbose.segments is None
    assert 0 <= words[0].start < words[0].end <= words[1].start < words[1].end <= 2.0
    both = client.audio.transcriptions.create(model="peaked", file=clip(), response_format="verbose_json",
                                              timestamp_granularities=["word", "segment"])
    assert len(both.words) == 2 and len(both.segments) == 1


def test_the_reason_of_a_refusal_reaches_the_client(client: openai.OpenAI, url: str) -> None:
    create = client.audio.transcriptions.create
    cases = [
        (dict(model="peaked", file=("notes.txt", b"plain text, not audio" * 10)), 415, "unreadable_audio",
         "not an audio file"),
        (dict(model="whisper-1", file=clip()), 404, "model_not_found", "GET /v1/models lists 'peaked'"),
        (dict(model="peaked", file=clip(), language="tlh"), 400, "unknown_language", "unknown language"),
        (dict(model="peaked", file=clip(), prompt="Acme"), 400, "unsupported_field", "takes no prompt"),
        (dict(model="peaked", file=clip(), temperature=0.7), 400, "unsupported_field", "only 0"),
        (dict(model="peaked", file=clip(), timestamp_granularities=["word"]), 400, "bad_granularity",
         "verbose_json"),
        (dict(model="peaked", file=clip(seconds=41, fs=8000)), 413, "too_long", "over the limit of 40 s"),
        (dict(model="peaked", file=clip(seconds=40)), 413, "too_large", "over the limit of 1114112 bytes"),
    ]
    for kwargs, status, code, says in cases:
        with pytest.raises(openai.APIStatusError) as e:
            create(**kwargs)
        assert e.value.status_code == status and e.value.code == code, (code, e.value)
        assert says in e.value.message, e.value.message
    bad_key = openai.OpenAI(base_url=f"{url}/v1", api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        bad_key.audio.transcriptions.create(model="peaked", file=clip())
    assert e.value.code == "invalid_api_key"
    no_file = httpx.post(f"{url}/v1/audio/transcriptions", data={"model": "peaked"},
                         headers={"Authorization": f"Bearer {KEY}"})
    assert no_file.status_code == 400 and no_file.json()["error"]["param"] == "file"


def test_models(client: openai.OpenAI) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == ["peaked"] and models.data[0].owned_by == "funasr-recipe"
    assert client.models.retrieve("peaked").id == "peaked"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("whisper-1")


@pytest.mark.parametrize("container", ["webm", "m4a"])
def test_browser_and_phone_recordings(client: openai.OpenAI, container: str) -> None:
    data = recorded(tone(3.0)[:, 0], 16000, container)
    verbose = client.audio.transcriptions.create(model="peaked", file=(f"rec.{container}", io.BytesIO(data)),
                                                 response_format="verbose_json")
    assert verbose.text == TEXT
    assert verbose.duration == pytest.approx(3.0, abs=0.15)  # AAC adds its encoder delay
    with pytest.raises(openai.APIStatusError) as e:  # a recording cut short is refused, not half-heard
        client.audio.transcriptions.create(model="peaked", file=(f"cut.{container}", data[: len(data) // 3]))
    assert e.value.code in ("truncated_audio", "unreadable_audio"), e.value


def test_words_from_tokens() -> None:
    tokens = [{"token": t, "start": round(i / 10, 3), "end": round(i / 10 + 0.05, 3)}
              for i, t in enumerate(["▁NI", "NE", "▁", "ZE", "RO", "你", "好", "▁OK"])]
    assert formats.words(tokens) == [
        {"word": "NINE", "start": 0.0, "end": 0.15}, {"word": "ZERO", "start": 0.3, "end": 0.45},
        {"word": "你", "start": 0.5, "end": 0.55}, {"word": "好", "start": 0.6, "end": 0.65},
        {"word": "OK", "start": 0.7, "end": 0.75}]
