"""The HTTP service facing a network (issue #32): API keys, limits enforced before the work they
guard, errors that monitoring sees, OpenAI's error shape, start-up checks. On a real uvicorn server
(the guarded protocol included) over a peaked export that says "NINE ZERO" for any audio."""

from __future__ import annotations

import json
import socket
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import uvicorn

from funasr_recipe.core.rejections import BadInputError
from funasr_recipe.features.audio import AudioError
from funasr_recipe.runtime.onnx_asr import OnnxASR
from funasr_recipe.serving.app import ServeSettings, create_app
from funasr_recipe.serving.cli import main as serve_main
from funasr_recipe.serving.guard import load_api_keys
from funasr_recipe.serving.protocol import guarded_protocol
from funasr_recipe.serving.upload import read_upload
from tests.helpers.serve_app import TEXT, encoded, tone
from tests.helpers.serve_fixtures import serving

KEY = "sk-test-0123456789abcdef"
SETTINGS = dict(max_upload_mb=1.0, max_duration_s=40.0, segment_s=8.0, header_timeout_s=1.0,
                read_timeout_s=1.0, body_timeout_s=3.0, max_connections=8)


@pytest.fixture(scope="module")
def server(asr: OnnxASR) -> Iterator[tuple[str, object]]:
    settings = ServeSettings(**SETTINGS)
    app = create_app(asr, settings, "peaked", (KEY.encode(),))
    errors = app.state.metrics.errors
    http = guarded_protocol(settings.header_timeout_s, settings.max_connections,
                            lambda reason: errors.labels(reason).inc())
    with serving(app, http=http) as url:
        yield url, app


def client(url: str, key: str | None = KEY) -> httpx.Client:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.Client(base_url=url, headers=headers, timeout=30)


def post(http: httpx.Client, data: bytes, name: str = "a.wav", url: str = "/v1/transcriptions",
         **form: str) -> httpx.Response:
    return http.post(url, files={"file": (name, data, "application/octet-stream")}, data=form)


def error(r: httpx.Response) -> dict:
    """OpenAI's error object of a refusal; fails on any other shape."""
    body = r.json()
    assert set(body) == {"error"} and {"message", "type", "code"} <= set(body["error"]), r.text
    return body["error"]


def counted(url: str, name: str) -> float:
    text = client(url).get("/metrics").text
    return sum(float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith(name))


# 1. authentication, timeouts, connection limits


def test_requests_without_the_key_are_401_and_health_stays_open(server: tuple) -> None:
    url, _ = server
    wav = encoded(tone(1.0), 16000)
    for key in (None, "wrong", KEY + "x", KEY[:-1]):
        r = post(client(url, key), wav)
        assert r.status_code == 401 and error(r)["code"] == "invalid_api_key", (key, r.text)
        assert error(r)["type"] == "authentication_error" and r.headers["www-authenticate"] == "Bearer"
    assert client(url, None).get("/metrics").status_code == 401
    assert client(url, None).get("/v1/models").status_code == 401
    r = client(url, None).get("/health")
    assert r.status_code == 200 and r.json()["auth"] == "bearer"
    assert client(url, None).get("/").status_code == 200  # the page, which sends the key it is given
    r = post(client(url), wav)
    assert r.status_code == 200 and r.json()["text"] == TEXT
    assert counted(url, 'recipe_serve_errors_total{reason="invalid_api_key"}') >= 4


def test_api_keys_come_from_a_file_or_the_environment(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RECIPE_API_KEY", raising=False)
    monkeypatch.delenv("RECIPE_API_KEY_FILE", raising=False)
    assert load_api_keys(None) == ()
    keys = tmp_path / "keys"
    keys.write_text("# rotated on 2026-12-01\nsk-new\n\nsk-old\n")
    assert load_api_keys(keys) == (b"sk-new", b"sk-old")
    monkeypatch.setenv("RECIPE_API_KEY", "sk-env")
    assert load_api_keys(None) == (b"sk-env",)
    monkeypatch.setenv("RECIPE_API_KEY_FILE", str(keys))
    assert load_api_keys(None) == (b"sk-new", b"sk-old")
    (tmp_path / "empty").write_text("# none yet\n")
    for bad, says in ((tmp_path / "empty", "holds no key"), (tmp_path / "missing", "cannot read")):
        with pytest.raises(BadInputError, match=says):
            load_api_keys(bad)
    with pytest.raises(SystemExit):  # the key itself is never an option: ps would show it
        serve_main(["--model-dir", str(tmp_path), "--api-key", "sk-new"])


def _raw(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=5)


def _closed_within(sock: socket.socket, seconds: float) -> tuple[bool, bytes]:
    """(whether the server closed the connection within ``seconds``, what it sent)."""
    sock.settimeout(seconds)
    got = b""
    try:
        while chunk := sock.recv(65536):
            got += chunk
        return True, got
    except TimeoutError:
        return False, got
    except ConnectionResetError:
        return True, got


def test_stalled_headers_and_bodies_are_cut_off(server: tuple) -> None:
    url, _ = server
    before = counted(url, 'recipe_serve_errors_total{reason="header_timeout"}')
    sock = _raw(url)
    sock.sendall(b"POST /v1/transcriptions HTTP/1.1\r\nHost: x\r\nContent-")  # half the headers
    start = time.monotonic()
    closed, _ = _closed_within(sock, 5)
    assert closed and time.monotonic() - start < 3.0  # header_timeout_s 1.0
    assert counted(url, 'recipe_serve_errors_total{reason="header_timeout"}') == before + 1
    # A body shorter than its Content-Length: a 408 once a read has waited read_timeout_s.
    sock = _raw(url)
    sock.sendall(f"POST /v1/transcriptions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
                 "Content-Type: multipart/form-data; boundary=b\r\nContent-Length: 100000\r\n\r\n--b\r\n"
                 .encode())
    closed, answer = _closed_within(sock, 5)
    assert answer.startswith(b"HTTP/1.1 408") and b'"request_timeout"' in answer, answer[:300]


def test_connections_over_the_limit_are_closed_at_once(server: tuple) -> None:
    url, _ = server
    time.sleep(2.0)  # the earlier tests' idle connections closed by their header deadline
    socks = [_raw(url) for _ in range(SETTINGS["max_connections"] + 4)]
    try:
        time.sleep(0.2)  # under header_timeout_s: only the ones over the cap can be closed by now
        closed = [_closed_within(s, 0.01)[0] for s in socks]
        assert sum(closed) == 4 and not any(closed[:SETTINGS["max_connections"]]), closed
    finally:
        for s in socks:
            s.close()
    time.sleep(2.0)  # the rest, closed by their header deadline
    assert post(client(url), encoded(tone(1.0), 16000)).status_code == 200


# 2. limits applied before the work


def test_an_hour_of_compressed_silence_is_refused_from_its_header() -> None:
    flac = encoded(np.zeros((3600 * 48000, 2), np.int16), 48000, "FLAC")
    assert len(flac) < 2**20  # an upload under the size limit...
    tracemalloc.start()
    try:
        with pytest.raises(AudioError) as e:
            read_upload(flac, "silence.flac", max_s=600)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert e.value.reason == "too_long" and "3600.0 s" in e.value.detail
    assert peak < 20 * 2**20  # ...refused without decoding its 1.3 GB (the tail probe reads 0.1 s)


def test_a_chunked_upload_over_the_limit_is_refused_while_it_streams(server: tuple) -> None:
    url, _ = server
    sock = _raw(url)
    sock.sendall(f"POST /v1/transcriptions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
                 "Content-Type: multipart/form-data; boundary=b\r\n"
                 "Transfer-Encoding: chunked\r\n\r\n".encode())
    part = b'--b\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\n'
    sock.sendall(b"%x\r\n%s\r\n" % (len(part), part))
    chunk = b"x" * 65536
    sent, answer = 0, b""
    sock.settimeout(0.05)
    while sent < 16 * 2**20 and not answer:  # 16 MiB offered, never ended: only a streamed count stops it
        try:
            sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            sent += len(chunk)
            answer = sock.recv(65536)
        except TimeoutError:
            continue
        except (BrokenPipeError, ConnectionResetError):
            break
    sock.settimeout(5)
    answer += _closed_within(sock, 2)[1]
    assert answer.startswith(b"HTTP/1.1 413") and b'"too_large"' in answer, answer[:300]
    assert sent < 6 * 2**20, sent  # refused after the 1 MiB limit and the sockets' buffers


# 3. errors monitoring sees, no silent wrong answers


def test_implausible_rates_and_non_finite_audio_are_counted_400s(server: tuple) -> None:
    url, _ = server
    http = client(url)
    wave = tone(1.0)
    nan = wave.copy()
    nan[100] = np.nan
    inf = wave.copy()
    inf[5] = np.inf
    cases = [(encoded(tone(0.001, 100_000_000)[:100], 100_000_000), "bad_sample_rate"),
             (encoded(tone(1.0, 2000), 2000), "bad_sample_rate"),
             (encoded(nan, 16000, subtype="FLOAT"), "non_finite_audio"),
             (encoded(inf, 16000, subtype="FLOAT"), "non_finite_audio")]
    for data, reason in cases:
        before = counted(url, f'recipe_serve_errors_total{{reason="{reason}"}}')
        r = post(http, data)
        assert r.status_code == 400 and error(r)["code"] == reason and error(r)["param"] == "file", r.text
        assert counted(url, f'recipe_serve_errors_total{{reason="{reason}"}}') == before + 1


def test_digital_silence_is_not_decoded_into_words(server: tuple) -> None:
    url, _ = server
    http = client(url)
    silent = post(http, encoded(np.zeros((10 * 16000, 1), np.float32), 16000)).json()
    assert silent["text"] == "" and silent["tokens"] == [] and silent["duration"] == 10.0
    # A quiet recording (-50 dBFS) is sound, and decoded: the graph says its words for it.
    quiet = post(http, encoded(tone(2.0) * 0.0126, 16000)).json()
    assert quiet["text"] == TEXT
    # Silence and speech in one request: only the silent piece is left out.
    mixed = np.concatenate([tone(6.0), np.zeros((10 * 16000, 1), np.float32)])
    texts = [s["text"] for s in post(http, encoded(mixed, 16000)).json()["segments"]]
    assert texts[0] == TEXT and len(texts) >= 2 and set(texts[1:]) == {""}, texts


def test_metric_labels_are_route_templates_and_a_failure_is_a_counted_500(server: tuple) -> None:
    url, app = server
    http = client(url)
    for i in range(30):
        assert http.get(f"/random-{i}-{time.time_ns()}").status_code == 404
    assert http.get("/v1/models/nothing-like-it").status_code == 404
    text = http.get("/metrics").text
    endpoints = {ln.split('endpoint="')[1].split('"')[0] for ln in text.splitlines()
                 if ln.startswith("recipe_serve_requests_total{")}
    assert endpoints <= {"unmatched", "/v1/transcriptions", "/metrics", "/v1/models", "/v1/models/{model}",
                         "/health", "/", "/static", "/v1/audio/transcriptions"}, endpoints
    assert "unmatched" in endpoints and "/v1/models/{model}" in endpoints
    batcher = app.state.batcher
    decode = batcher.fn
    batcher.fn = lambda items: 1 / 0
    try:
        r = post(http, encoded(tone(1.0), 16000))
    finally:
        batcher.fn = decode
    assert r.status_code == 500 and error(r) == {"message": "the server failed on this request; it is logged",
                                                 "type": "server_error", "code": "internal_error",
                                                 "param": None}
    assert counted(url, 'recipe_serve_errors_total{reason="internal_error"}') >= 1
    assert post(http, encoded(tone(1.0), 16000)).status_code == 200


# 6. start-up checks, no CDN, no paths


def test_settings_that_cannot_work_are_refused_at_start(asr: OnnxASR) -> None:
    with pytest.raises(BadInputError, match="200 pieces, more than --queue-size 64"):
        create_app(asr, ServeSettings(segment_s=3))
    create_app(asr, ServeSettings(segment_s=3, queue_size=200))


def test_no_page_from_a_cdn_and_no_path_in_the_schema(server: tuple, asr: OnnxASR) -> None:
    url, _ = server
    http = client(url)
    assert http.get("/docs").status_code == 404 and http.get("/redoc").status_code == 404
    schema = http.get("/openapi.json")
    assert schema.status_code == 200 and str(asr.dir) not in schema.text
    assert str(asr.dir.parent) not in json.dumps(http.get("/health").json())


def test_uvicorn_config_takes_the_guarded_protocol(asr: OnnxASR) -> None:
    config = uvicorn.Config(create_app(asr), http=guarded_protocol(1.0, 4))
    config.load()
    assert config.http_protocol_class.__name__ == "GuardedH11Protocol"
