"""The HTTP service's parts without a model: the dynamic batcher, the pause splitter, greedy CTC with
positions, the subtitle formats and the decoding of uploads."""

from __future__ import annotations

import asyncio
import io
import threading
import time

import numpy as np
import pytest
import soundfile as sf

from funasr_recipe.features.audio import AudioError, decode_audio_bytes
from funasr_recipe.runtime.onnx_session import collapse_ctc, ctc_spans
from funasr_recipe.serving import formats
from funasr_recipe.serving.batcher import DynamicBatcher, QueueFull
from funasr_recipe.serving.errors import Refused
from funasr_recipe.serving.guard import Guard
from funasr_recipe.serving.metrics import ServeMetrics
from funasr_recipe.serving.segmenter import split_at_pauses
from tests.helpers.make_bad_kaldi_dir import DEFAULT_WAV_DIR


def test_batcher_batches_what_arrives_together_and_keeps_order() -> None:
    sizes: list[int] = []
    batcher = DynamicBatcher(lambda items: [x * 10 for x in items], max_batch=4, max_wait_ms=200,
                             queue_size=16, on_batch=lambda n, _: sizes.append(n))
    try:
        with batcher.expect():  # a request on its way: the worker waits for it (up to max_wait)
            futures = [batcher.submit([i, i + 100]) for i in range(5)]  # 10 pieces in one burst
        assert [f.result(5) for f in futures] == [[i * 10, (i + 100) * 10] for i in range(5)]
    finally:
        batcher.close()
    assert sizes == [4, 4, 2] and max(sizes) <= 4


def test_batcher_waits_only_for_requests_on_their_way_and_at_most_max_wait() -> None:
    batcher = DynamicBatcher(lambda items: items, max_batch=8, max_wait_ms=300, queue_size=8)
    try:
        start = time.perf_counter()
        assert batcher.submit(["a"]).result(5) == ["a"]
        assert time.perf_counter() - start < 0.1  # nothing else coming: no wait for a batch
        with batcher.expect():  # one coming that never arrives: the batch goes after max_wait
            start = time.perf_counter()
            assert batcher.submit(["b"]).result(5) == ["b"]
            assert 0.25 < time.perf_counter() - start < 2.0
    finally:
        batcher.close()


def test_batcher_refuses_what_does_not_fit_and_survives_a_failing_batch() -> None:
    release = threading.Event()

    def fn(items: list) -> list:
        if "boom" in items:
            raise ValueError("boom")
        release.wait(5)
        return items

    batcher = DynamicBatcher(fn, max_batch=1, max_wait_ms=0, queue_size=2)
    try:
        first = batcher.submit(["x"])  # taken by the worker, which blocks on release
        time.sleep(0.2)
        queued = batcher.submit(["y", "z"])  # fills the queue
        with pytest.raises(QueueFull):
            batcher.submit(["w"])
        assert batcher.depth == 2
        release.set()
        assert first.result(5) == ["x"] and queued.result(5) == ["y", "z"]
        with pytest.raises(ValueError, match="boom"):
            batcher.submit(["boom"]).result(5)
        assert batcher.submit(["after"]).result(5) == ["after"]  # the worker goes on
    finally:
        release.set()
        batcher.close()


def _tone(seconds: float, fs: int, rng: np.random.Generator) -> np.ndarray:
    return (0.3 * rng.standard_normal(int(seconds * fs))).astype(np.float32)


def test_split_at_pauses_cuts_in_the_pauses_and_keeps_every_sample() -> None:
    fs, rng = 16000, np.random.default_rng(0)
    parts, pauses, t = [], [], 0.0
    for k in range(12):  # 12 bursts of 2.5 s "speech" with 0.4 s pauses of low noise between them
        parts.append(_tone(2.5, fs, rng))
        t += 2.5
        if k < 11:
            parts.append((1e-3 * rng.standard_normal(int(0.4 * fs))).astype(np.float32))
            pauses.append((t, t + 0.4))
            t += 0.4
    wave = np.concatenate(parts)
    ranges = split_at_pauses(wave, fs, max_s=8.0)
    assert ranges[0][0] == 0 and ranges[-1][1] == len(wave)
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))  # contiguous: nothing lost
    assert all(b - a <= 8.0 * fs for a, b in ranges) and len(ranges) >= 5
    for _, cut in ranges[:-1]:
        assert any(lo <= cut / fs <= hi for lo, hi in pauses), cut / fs


def test_split_without_pauses_cuts_at_the_quietest_frame() -> None:
    fs, rng = 8000, np.random.default_rng(1)
    wave = _tone(25.0, fs, rng)
    quiet = int(14.0 * fs)
    wave[quiet:quiet + 80] *= 1e-3  # one 10 ms dip, too short to be a pause
    ranges = split_at_pauses(wave, fs, max_s=20.0)
    assert ranges == [(0, quiet), (quiet, len(wave))]
    assert split_at_pauses(wave[:100], fs, max_s=20.0) == [(0, 100)]
    with pytest.raises(ValueError):
        split_at_pauses(wave, fs, max_s=0)


def test_ctc_spans_give_each_tokens_frames() -> None:
    best = np.array([0, 5, 5, 0, 0, 7, 5, 5, 0])
    assert ctc_spans(best) == [(5, 1, 3), (7, 5, 6), (5, 6, 8)]
    assert [t for t, _, _ in ctc_spans(best)] == collapse_ctc(best)
    assert ctc_spans(np.array([], dtype=np.int64)) == []


def test_subtitles() -> None:
    result = {"segments": [{"start": 0.0, "end": 1.5, "text": "one"}, {"start": 1.5, "end": 2.0, "text": ""},
                           {"start": 3661.25, "end": 3662.0, "text": "two"}]}
    assert formats.srt(result) == ("1\n00:00:00,000 --> 00:00:01,500\none\n\n"
                                   "2\n01:01:01,250 --> 01:01:02,000\ntwo\n")
    assert formats.vtt(result).startswith("WEBVTT\n\n00:00:00.000 --> 00:00:01.500\none\n")


def _wav_bytes(wave: np.ndarray, fs: int, fmt: str = "WAV") -> bytes:
    buf = io.BytesIO()
    sf.write(buf, wave, fs, format=fmt)
    return buf.getvalue()


def test_decode_audio_bytes_refuses_bad_uploads_by_name() -> None:
    wav = sorted(DEFAULT_WAV_DIR.glob("*.wav"))[0]
    data = wav.read_bytes()
    wave, fs = decode_audio_bytes(data, "a.wav")
    assert fs == 8000 and wave.shape == (len(sf.read(wav)[0]), 1)
    cases = {b"": "empty_file", b"not audio at all, just text" * 10: "unreadable_audio",
             data[: len(data) // 2]: "truncated_audio",
             _wav_bytes(np.zeros((0, 1), np.float32), 16000): "empty_audio"}
    flac = _wav_bytes(wave, fs, "FLAC")
    cases[flac[: len(flac) * 2 // 3]] = "truncated_audio"
    for payload, reason in cases.items():
        with pytest.raises(AudioError) as e:
            decode_audio_bytes(payload, "upload.x")
        assert e.value.reason == reason and "upload.x" in e.value.detail and "BytesIO" not in e.value.detail


def _guard_run(app, chunks: list[tuple[float, bytes, bool]], read_timeout_s: float = 0.25,
               body_timeout_s: float = 0.5) -> list[dict]:
    """``app`` behind a Guard over a client that sends ``chunks`` as (delay s, bytes, more_body), then
    stays connected; returns what the client was sent."""
    sent: list[dict] = []
    pending = list(chunks)

    async def receive() -> dict:
        if not pending:
            await asyncio.Event().wait()
        delay, body, more = pending.pop(0)
        await asyncio.sleep(delay)
        return {"type": "http.request", "body": body, "more_body": more}

    async def send(message: dict) -> None:
        sent.append(message)

    guard = Guard(app, ServeMetrics(lambda: 0), keys=(), max_body=1000, body_timeout_s=body_timeout_s,
                  read_timeout_s=read_timeout_s)
    asyncio.run(guard({"type": "http", "path": "/", "method": "GET", "headers": []}, receive, send))
    return sent


def test_guard_lets_a_response_outlast_the_read_timeout_once_the_body_is_in() -> None:
    """Starlette's FileResponse listens for a disconnect through receive() while it sends; a read
    deadline there cut the page off mid-body on a loaded machine (headers sent, 0 of 4556 bytes)."""

    async def app(scope, receive, send) -> None:  # FileResponse's shape: listen while a slow send runs
        assert (await receive())["more_body"] is False
        await send({"type": "http.response.start", "status": 200, "headers": []})
        listener = asyncio.create_task(receive())
        await asyncio.sleep(0.3)  # six read timeouts
        assert not listener.done(), listener.exception()
        listener.cancel()
        await send({"type": "http.response.body", "body": b"page", "more_body": False})

    sent = _guard_run(app, [(0.0, b"", False)], read_timeout_s=0.05, body_timeout_s=0.05)
    assert [m.get("body") for m in sent] == [None, b"page"]


def test_guard_does_not_charge_the_apps_own_time_to_the_clients_body() -> None:
    """CI cut the page off after its headers again: a loaded machine took longer than the whole body's
    limit to reach FileResponse's first receive(), and that receive of an empty body, already in hand,
    was refused. Only the time spent waiting on the client counts."""

    async def app(scope, receive, send) -> None:
        await asyncio.sleep(0.7)  # the app's own time: over the body's 0.5 s
        message = await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": message["body"], "more_body": False})

    sent = _guard_run(app, [(0.0, b"", False)])
    assert [m.get("status", m.get("body")) for m in sent] == [200, b""]
    sent = _guard_run(app, [(0.0, b"a", True), (0.05, b"b", False)])
    assert [m.get("status", m.get("body")) for m in sent] == [200, b"a"]


def test_guard_still_refuses_a_body_that_trickles_past_its_whole_limit() -> None:
    """Reads of 0.1 s each, under the 0.25 s a read may take, add up past the body's 0.5 s: a 408
    after about five of the eight, whatever time the app spends between them."""
    reads: list[int] = []
    refused: list[int] = []

    async def app(scope, receive, send) -> None:
        try:
            while (await receive()).get("more_body"):
                reads.append(1)
                await asyncio.sleep(0.2)  # the app's work between reads: not the client's time
        except Refused as e:
            refused.append(e.status_code)
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    _guard_run(app, [(0.1, b"x", True)] * 8)
    assert refused == [408] and 3 <= len(reads) <= 6, (refused, len(reads))
    reads.clear()
    refused.clear()
    _guard_run(app, [(0.05, b"x", True)] * 2 + [(0.0, b"x", False)])
    assert refused == [] and len(reads) == 2
