"""The service's web page (funasr_recipe/serving/static/index.html) in a real headless Chromium.

Starts ``python -m local.serve`` on the ``trained`` fixture's export (a real tiny SenseVoice), opens
GET / in Debian's Chromium through playwright, and checks what a user sees: a bundled recording
uploaded and transcribed to exactly what the recipe's batch decoder (OnnxASR on the same export) gives,
its tags, its token spans drawn on the waveform and listed in the table; a text file's rejection shown
as the server's own 4xx reason; and a recording from Chromium's synthetic microphone sent as
MediaRecorder writes it (WebM/Opus), which the server decodes. Writes a screenshot to tmp_path, and to
$FUNASR_RECIPE_SCREENSHOT when that is set.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from funasr_recipe.data.tags import split_tags
from tests.helpers.browser import CHROMIUM, chromium, served
from tests.helpers.make_bad_kaldi_dir import DEFAULT_WAV_DIR
from tests.helpers.train_data import DEV_SPEAKER

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
NO_CHROMIUM = f"{CHROMIUM} is missing (apt-get install chromium)"
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not CHROMIUM.is_file(), reason=NO_CHROMIUM)]
VIEWPORT = {"width": 1280, "height": 800}
NOT_AUDIO = {"name": "notes.txt", "mimeType": "text/plain", "buffer": b"these are notes, not audio\n"}


@pytest.fixture(scope="module")
def export(trained: Path) -> Path:
    return trained / "export"


@pytest.fixture(scope="module")
def server(export: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with served(export, tmp_path_factory.mktemp("serve") / "serve.log") as url:
        yield url


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as b:
        yield b


@pytest.fixture
def page(browser: Browser, server: str) -> Iterator[Page]:
    context = browser.new_context(viewport=VIEWPORT, permissions=["microphone"])
    page = context.new_page()
    page.goto(f"{server}/")
    sync_api.expect(page.locator("#health")).to_have_attribute("data-state", "ok")
    yield page
    context.close()


def batch_decoded(export: Path) -> tuple[Path, str, dict[str, str]]:
    """The first held-out recording that the batch decoder gives words for: (path, text, tags)."""
    from funasr_recipe.runtime.onnx_asr import OnnxASR

    asr = OnnxASR(export)
    for wav in sorted(DEFAULT_WAV_DIR.glob(f"*_{DEV_SPEAKER}_*.wav"))[:20]:
        tags, text = split_tags(asr(str(wav))[0])
        if text:
            return wav, text, tags
    pytest.fail("the batch decoder gives no words for 20 dev recordings: the model did not learn")


def submit(page: Page) -> str:
    """Click Transcribe and wait for the page to finish; its final state, "done" or "error"."""
    page.click("#transcribe")
    page.wait_for_function("['done', 'error'].includes(document.querySelector('#result').dataset.state)",
                           timeout=60_000)
    return page.get_attribute("#result", "data-state")


def span_alpha(page: Page, times: list[float]) -> list[int]:
    """The canvas's alpha just inside the span band at each time: > 0 where a span is drawn."""
    return page.evaluate("""(times) => {
        const c = document.querySelector('#waveform'), g = c.getContext('2d');
        const dpr = c.width / c.clientWidth, y = Math.round((+c.dataset.spanTop + 1) * dpr);
        const dur = +c.dataset.duration;
        return times.map((t) => g.getImageData(Math.round(t / dur * c.width), y, 1, 1).data[3]);
    }""", times)


def save_screenshot(page: Page, tmp_path: Path) -> None:
    shot = tmp_path / "web_page.png"
    page.screenshot(path=str(shot), full_page=True)
    if target := os.environ.get("FUNASR_RECIPE_SCREENSHOT"):
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, target)


def test_upload_shows_the_batch_decoders_transcript_and_token_spans(page: Page, export: Path,
                                                                    tmp_path: Path) -> None:
    wav, text, tags = batch_decoded(export)
    page.set_input_files("#file", str(wav))
    assert submit(page) == "done", page.text_content("#error")
    sync_api.expect(page.locator("#text")).to_have_text(text)
    if "language" in tags:
        assert page.get_attribute("#tags [data-kind=language]", "data-value") == tags["language"]
    rows = page.locator("#tokens tbody tr")
    assert rows.count() >= 1
    assert page.get_attribute("#waveform", "data-spans") == str(rows.count())
    spans = [tuple(float(rows.nth(i).locator("td").nth(col).text_content()) for col in (2, 3))
             for i in range(rows.count())]
    assert all(a > 0 for a in span_alpha(page, [(s + e) / 2 for s, e in spans])), "a token span is not drawn"
    # Before the first token and after the last one, where there is any room: no span colour.
    end = float(page.get_attribute("#waveform", "data-duration"))
    gaps = [t for t in (spans[0][0] / 2, (spans[-1][1] + end) / 2)
            if not any(s - 0.02 <= t <= e + 0.02 for s, e in spans)]
    assert all(a == 0 for a in span_alpha(page, gaps)), "span colour outside every token's span"
    assert page.is_hidden("#error")
    save_screenshot(page, tmp_path)


def test_a_text_file_shows_the_servers_reason(page: Page) -> None:
    page.set_input_files("#file", NOT_AUDIO)
    with page.expect_response("**/v1/transcriptions") as response:
        assert submit(page) == "error"
    assert 400 <= response.value.status < 500, response.value.text()
    sync_api.expect(page.locator("#error")).to_be_visible()
    assert page.text_content("#error") == response.value.json()["error"]["message"]
    assert page.text_content("#text") == ""
    assert page.locator("#tokens tbody tr").count() == 0


def test_a_recording_is_sent_as_the_browser_records_it(page: Page) -> None:
    page.click("#record")
    sync_api.expect(page.locator("#record")).to_have_attribute("aria-pressed", "true")
    page.wait_for_timeout(1500)
    page.click("#record")
    sync_api.expect(page.locator("#player")).to_be_visible()
    recorded = float(page.text_content("#rec-time").split()[0])
    assert recorded >= 1.0
    with page.expect_response("**/v1/transcriptions") as response:
        assert submit(page) == "done", page.text_content("#error")
    # What was sent (playwright does not expose a blob's multipart body): the file the player plays.
    magic = page.evaluate("""async () => {
        const b = new Uint8Array(await (await fetch(document.querySelector('#player').src)).arrayBuffer());
        return Array.from(b.slice(0, 4));
    }""")
    assert magic == [0x1A, 0x45, 0xDF, 0xA3], "not a WebM (EBML) file"  # soundfile reads none of these
    answer = response.value.json()
    # MediaRecorder starts and stops a little after the clicks; the decoded audio is what it wrote.
    assert abs(answer["duration"] - recorded) < 0.3, (answer["duration"], recorded)
    assert answer["channels"] in (1, 2) and answer["sample_rate"] == 48000  # Opus decodes at 48 kHz
