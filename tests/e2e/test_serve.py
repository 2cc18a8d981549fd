"""The HTTP service (funasr_recipe/serving, local/serve.py, stage 6) on the tiny model that the
``trained`` fixture trains: the same texts as the batch decoder, tags and token times, any rate and
channel count, long audio split at pauses, OpenAI's formats, a 4xx for each kind of bad input, 503
when the queue is full, metrics, and stage 6 of run.sh answering a curl-like request."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import soundfile as sf
from fastapi.testclient import TestClient

from funasr_recipe.data.tags import split_tags
from funasr_recipe.runtime.onnx_asr import OnnxASR
from funasr_recipe.serving.app import ServeSettings, create_app
from funasr_recipe.serving.segmenter import split_at_pauses
from tests.helpers.run_sh import CLEAN_ENV, ROOT
from tests.helpers.serve_fixtures import serving
from tests.helpers.train_fixtures import free_port

pytestmark = pytest.mark.slow
N_DEV = 12


@pytest.fixture(scope="module")
def export(trained: Path) -> Path:
    return trained / "export"


@pytest.fixture(scope="module")
def asr(export: Path) -> OnnxASR:
    return OnnxASR(export)


@pytest.fixture(scope="module")
def dev(prepared: Path) -> list[str]:
    lines = (prepared / "data" / "dev" / "data.jsonl").read_text().splitlines()
    return [json.loads(line)["source"] for line in lines[:N_DEV]]


@pytest.fixture(scope="module")
def client(asr: OnnxASR) -> TestClient:
    settings = ServeSettings(max_upload_mb=1.0, max_duration_s=40.0, segment_s=8.0)
    with TestClient(create_app(asr, settings)) as c:
        yield c


def post(client: TestClient | httpx.Client, data: bytes, name: str = "a.wav", url: str = "/v1/transcriptions",
         **form: str) -> httpx.Response:
    return client.post(url, files={"file": (name, data, "application/octet-stream")}, data=form)


def wav_bytes(wave: np.ndarray, fs: int, fmt: str = "WAV") -> bytes:
    buf = io.BytesIO()
    sf.write(buf, wave, fs, format=fmt)
    return buf.getvalue()


def test_texts_tags_and_token_times_match_the_batch_decoder(client: TestClient, asr: OnnxASR,
                                                            dev: list[str]) -> None:
    batch = asr(dev)
    assert sum(bool(split_tags(t)[1]) for t in batch) >= N_DEV // 2  # the model says words, not only tags
    for path, full in zip(dev, batch, strict=True):
        r = post(client, Path(path).read_bytes())
        assert r.status_code == 200, r.text
        body = r.json()
        tags, text = split_tags(full)
        assert body["text"] == text
        assert (body["language"], body["emotion"], body["event"]) == (tags["language"], tags["emotion"],
                                                                      tags["event"])
        assert body["duration"] == pytest.approx(sf.info(path).duration, abs=1e-3)
        assert 0 < body["processing_time"] < 10
        pieces = [t["token"] for t in body["tokens"]]
        assert "".join(pieces).replace("▁", " ").strip() == text  # the tokens spell the text
        times = [(t["start"], t["end"]) for t in body["tokens"]]
        assert all(0 <= a < b <= body["duration"] for a, b in times), times
        assert all(p[1] <= q[0] for p, q in zip(times, times[1:], strict=False))  # in order, no overlap


def test_any_rate_and_channels_resampled_like_the_batch_decoder(client: TestClient, asr: OnnxASR,
                                                                dev: list[str], tmp_path: Path) -> None:
    import torch
    import torchaudio

    wave, fs = sf.read(dev[0], dtype="float32")
    up = torchaudio.functional.resample(torch.from_numpy(wave)[None], fs, 44100)[0].numpy()
    stereo = np.stack([up, 0.5 * up], axis=1)
    path = tmp_path / "stereo44k.flac"
    sf.write(path, stereo, 44100)
    body = post(client, path.read_bytes(), "stereo44k.flac").json()
    assert body["sample_rate"] == 44100 and body["channels"] == 2
    assert body["text"] == split_tags(asr([str(path)])[0])[1]


def test_long_audio_is_split_at_pauses_and_keeps_its_timeline(client: TestClient, asr: OnnxASR,
                                                              dev: list[str]) -> None:
    waves = [sf.read(p, dtype="float32")[0] for p in dev]
    fs = sf.info(dev[0]).samplerate
    gap = np.zeros(int(0.5 * fs), np.float32)
    starts, parts, t = [], [], 0
    for w in waves * 2:  # ~12 s of digits, 0.5 s of silence between them
        starts.append(t / fs)
        parts += [w, gap]
        t += len(w) + len(gap)
    long = np.concatenate(parts)
    body = post(client, wav_bytes(long, fs)).json()
    segments = body["segments"]
    assert len(segments) >= 2 and segments[0]["start"] == 0 and segments[-1]["end"] == body["duration"]
    assert all(s["end"] - s["start"] <= 8.0 for s in segments)
    assert all(a["end"] == b["start"] for a, b in zip(segments, segments[1:], strict=False))
    ranges = split_at_pauses(long, fs, 8.0)
    for a, _ in ranges[1:]:  # every cut falls in a gap, not in a word
        assert any(s - 0.5 <= a / fs <= s for s in starts[1:]), a / fs
    assert body["text"] == " ".join(s["text"] for s in segments if s["text"])
    for tok in body["tokens"]:  # times in the original timeline: inside their own segment
        assert any(s["start"] <= tok["start"] < tok["end"] <= s["end"] for s in segments), tok


def test_openai_form_and_formats(client: TestClient, asr: OnnxASR, dev: list[str]) -> None:
    # A clip the fixture's model transcribes with and without a language prompt: an empty transcript has
    # no subtitle cue and no segment, and which clips come out empty (and what the "en" prompt changes)
    # differs between training runs (CPU training is not bitwise repeatable).
    def texts(data: bytes) -> tuple[str, str]:
        return tuple(post(client, data, language=lang).json()["text"] for lang in ("auto", "en"))

    clips = [Path(p).read_bytes() for p in dev[:10]]
    chosen = next((i for i, d in enumerate(clips) if all(texts(d))), None)
    assert chosen is not None, f"the fixture's model transcribes none of {dev[:10]} in both ways"
    data, (text, text_en) = clips[chosen], texts(clips[chosen])
    assert text == split_tags(asr(dev[chosen])[0])[1]  # the service says what the model says
    url = "/v1/audio/transcriptions"
    model = client.get("/v1/models").json()["data"][0]["id"]
    assert model == "exp_ds"  # the experiment's tag, from export.json
    assert post(client, data, url=url, model=model).json() == {"text": text}
    assert post(client, data, url=url, model=model, response_format="text").text == text + "\n"
    srt = post(client, data, url=url, model=model, response_format="srt").text
    assert srt.startswith("1\n00:00:00,000 --> 00:00:00,") and srt.rstrip().endswith(text)
    vtt = post(client, data, url=url, model=model, response_format="vtt")
    assert vtt.headers["content-type"].startswith("text/vtt") and vtt.text.startswith("WEBVTT\n\n")
    verbose = post(client, data, url=url, model=model, response_format="verbose_json", language="en",
                   **{"timestamp_granularities[]": "word"}).json()
    assert verbose["text"] == text_en and verbose["language"] == "en"
    # The words' times are the tokens' (the same greedy CTC path as /v1/transcriptions gives).
    tokens = post(client, data, language="en").json()["tokens"]
    assert verbose["words"] and verbose["words"][0]["start"] == tokens[0]["start"]
    assert " ".join(w["word"] for w in verbose["words"]).replace(" ", "") == \
        "".join(t["token"] for t in tokens).replace("▁", "")
    assert post(client, data, url=url, model=model, response_format="docx").status_code == 400
    assert post(client, data, url=url, model="whisper-1").status_code == 404


def test_bad_input_gets_a_4xx_with_the_reason(client: TestClient, dev: list[str]) -> None:
    good = Path(dev[0]).read_bytes()
    wave, fs = sf.read(dev[0], dtype="float32")
    cases = [
        (b"", 400, "empty upload"),
        (b"hello, this is a text file\n" * 20, 415, "not an audio file"),
        (good[: len(good) // 2], 400, "truncated"),
        (wav_bytes(np.zeros(0, np.float32), fs), 400, "zero-length audio"),
        (wav_bytes(np.zeros(int(41 * 8000), np.float32), 8000), 413, "over the limit of 40 s"),
        (wav_bytes(np.zeros(int(70 * 8000), np.float32), 8000, "WAV"), 413, "over the limit"),  # > 1 MiB
    ]
    for data, status, reason in cases:
        r = post(client, data)
        assert r.status_code == status and reason in r.json()["error"]["message"], (status, r.text)
    r = post(client, good, language="klingon")
    assert r.status_code == 400 and "unknown language 'klingon'" in r.json()["error"]["message"]
    no_file = client.post("/v1/transcriptions", data={"language": "en"})
    assert no_file.status_code == 400 and no_file.json()["error"]["param"] == "file"
    assert post(client, good).status_code == 200  # and the service goes on
    metrics = client.get("/metrics").text
    for reason in ("empty_file", "unreadable_audio", "truncated_audio", "empty_audio", "too_long",
                   "too_large", "unknown_language"):
        assert f'recipe_serve_errors_total{{reason="{reason}"}}' in metrics, reason


def test_concurrent_requests_are_batched_and_a_full_queue_is_a_503(asr: OnnxASR, dev: list[str]) -> None:
    app = create_app(asr, ServeSettings(max_batch=4, max_wait_ms=50, queue_size=4, max_duration_s=40,
                                        segment_s=10))
    data = [Path(p).read_bytes() for p in dev[:8]]
    with serving(app) as url, httpx.Client(base_url=url, timeout=30) as http:
        with ThreadPoolExecutor(8) as pool:
            codes = list(pool.map(lambda d: post(http, d).status_code, data))
        assert codes.count(200) >= 4 and set(codes) <= {200, 503}
        metrics = http.get("/metrics").text
        sizes = [ln for ln in metrics.splitlines() if ln.startswith("recipe_serve_batch_size_count")]
        batches = float(sizes[0].split()[-1])
        assert batches < codes.count(200)  # some requests shared a batch
        # A blocked decoder: the batch it holds (1 to 4 requests) and the 4 queued ones are accepted, the
        # others refused at once with Retry-After.
        batcher = app.state.batcher
        decode, gate = batcher.fn, threading.Event()
        batcher.fn = lambda items: (gate.wait(10), decode(items))[1]
        try:
            with ThreadPoolExecutor(12) as pool:
                futures = [pool.submit(post, http, data[0]) for _ in range(12)]
                time.sleep(1.5)
                gate.set()
                answers = [f.result() for f in futures]
        finally:
            gate.set()
            batcher.fn = decode
        refused = [r for r in answers if r.status_code == 503]
        accepted = sum(r.status_code == 200 for r in answers)
        assert 5 <= accepted <= 8 and len(refused) == 12 - accepted
        assert len(refused) >= 4 and all(r.headers["retry-after"] == "1" for r in refused)
        assert all("busy" in r.json()["error"]["message"] for r in refused)
        assert 'recipe_serve_errors_total{reason="queue_full"}' in http.get("/metrics").text


def test_health_metrics_and_page(client: TestClient, dev: list[str]) -> None:
    health = client.get("/health").json()
    assert health["status"] == "ok" and health["family"] == "SenseVoiceSmall"
    assert health["sample_rate"] == 16000
    before = client.get("/metrics").text
    post(client, Path(dev[1]).read_bytes())
    after = client.get("/metrics").text

    def value(text: str, name: str) -> float:
        return sum(float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith(name))

    assert value(after, 'recipe_serve_requests_total{code="200",endpoint="/v1/transcriptions"}') == \
        value(before, 'recipe_serve_requests_total{code="200",endpoint="/v1/transcriptions"}') + 1
    audio = "recipe_serve_audio_seconds_total"
    assert value(after, audio) - value(before, audio) == pytest.approx(sf.info(dev[1]).duration, abs=1e-3)
    for name in ("recipe_serve_latency_seconds_bucket", "recipe_serve_batch_size_bucket",
                 "recipe_serve_queue_depth"):
        assert name in after
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    for asset in ("/static/app.js", "/static/style.css"):  # what the page loads, and nothing from elsewhere
        assert asset in page.text and client.get(asset).status_code == 200
    assert "http://" not in page.text and "https://" not in page.text


def test_stage_6_serves_the_model_until_stopped(trained: Path, asr: OnnxASR, dev: list[str]) -> None:
    port = free_port()
    proc = subprocess.Popen(["./run.sh", "--stage", "6", "--stop-stage", "6", "--exp-dir", str(trained),
                             "--serve-port", str(port)], cwd=ROOT, env=CLEAN_ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "stage 6 did not answer /health in 90 s"
            time.sleep(0.5)
        recording = ROOT / "corpora/free-spoken-digit-dataset/recordings/7_jackson_0.wav"
        r = httpx.post(f"{url}/v1/transcriptions", files={"file": recording.open("rb")}, timeout=30)
        assert r.status_code == 200 and r.json()["text"] == split_tags(asr([str(recording)])[0])[1]
        os.kill(proc.pid, signal.SIGTERM)  # run.sh alone, as a scheduler stops a job: the server goes too
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 128 + signal.SIGTERM and "Stage 6: HTTP service" in err
        assert "stopped by SIGTERM" in err
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"{url}/health", timeout=2)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
