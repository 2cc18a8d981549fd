"""Kaldi data dirs with ``segments``: utterances that are ranges of longer recordings.

Builds two long recordings by joining real FSDD digits (the bundled corpus) end to end, a Kaldi dir
whose segments cut them back into the digits, plus one bad segments line of every kind; checks the
validator (funasr_recipe/data/validate.py through data/segments.py) accepts the good ones with their
own durations and rejects each bad one naming segments and its line, and that the audio read for a
segment is exactly the digit that was joined in (features/audio.py). Writes under tmp_path only.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from funasr_recipe.data.validate import validate_set
from funasr_recipe.features.audio import AudioError, load_audio, probe_audio, split_range, with_range

ROOT = Path(__file__).resolve().parents[3]
DIGITS = sorted((ROOT / "corpora" / "free-spoken-digit-dataset" / "recordings").glob("*_jackson_*.wav"))[:6]
pytestmark = pytest.mark.skipif(len(DIGITS) < 6, reason="the bundled FSDD corpus is not in this checkout")


@pytest.fixture
def segmented(tmp_path: Path) -> tuple[Path, dict[str, np.ndarray]]:
    """data/train with two recordings of three digits each; {utterance: its samples}."""
    set_dir = tmp_path / "train"
    set_dir.mkdir()
    pieces: dict[str, np.ndarray] = {}
    wav_lines, seg_lines, text_lines, spk_lines = [], [], [], []
    for r in range(2):
        parts, offset = [], 0
        for i, path in enumerate(DIGITS[3 * r:3 * r + 3]):
            audio, rate = sf.read(path, dtype="int16")
            key = f"jackson-r{r}-{i}"
            pieces[key] = audio
            seg_lines.append(f"{key} rec{r} {offset / rate:.6f} {(offset + len(audio)) / rate:.6f}")
            text_lines.append(f"{key} {path.name.split('_')[0]}")
            spk_lines.append(f"{key} jackson")
            parts.append(audio)
            offset += len(audio)
        sf.write(tmp_path / f"rec{r}.flac", np.concatenate(parts), rate)
        wav_lines.append(f"rec{r} {tmp_path / f'rec{r}.flac'}")
    wav_lines.append(f"rec_dup {tmp_path / 'rec0.flac'}")
    wav_lines.append(f"rec_dup {tmp_path / 'rec1.flac'}")
    bad = {"jackson-bad-past": "rec0 0.5 99", "jackson-bad-order": "rec0 0.4 0.2",
           "jackson-bad-norec": "rec9 0 0.3", "jackson-bad-fields": "rec0 0.1",
           "jackson-bad-number": "rec0 zero 0.3", "jackson-bad-dup": "rec_dup 0 0.3"}
    for key, value in bad.items():
        seg_lines.append(f"{key} {value}")
        text_lines.append(f"{key} one")
        spk_lines.append(f"{key} jackson")
    seg_lines.append("jackson-whole rec1 0 -1")  # Kaldi's end -1: to the end of the recording
    text_lines.append("jackson-whole three digits")
    spk_lines.append("jackson-whole jackson")
    for name, lines in (("wav.scp", wav_lines), ("segments", seg_lines), ("text", text_lines),
                        ("utt2spk", spk_lines)):
        (set_dir / name).write_text("\n".join(lines) + "\n")
    return set_dir, pieces


def test_segments_are_validated_as_utterances_and_read_as_ranges(segmented) -> None:
    set_dir, pieces = segmented
    report = validate_set(set_dir, nj=2)
    assert report["input_entries"] == 13 and report["accepted"] == 7, report
    assert report["rejected_by_reason"] == {"bad_segment": 1, "duplicate_recording": 1,
                                            "malformed_segment": 2, "missing_recording": 1,
                                            "segment_past_end": 1}
    rejected = [line.split("\t") for line in (set_dir / "rejected.tsv").read_text().splitlines()[1:]]
    lines = (set_dir / "segments").read_text().splitlines()
    for file, lineno, key, _reason, _detail in rejected:
        assert file == str(set_dir / "segments") and lines[int(lineno) - 1].split()[0] == key
    entries = {o["key"]: o for o in map(json.loads, (set_dir / "data.jsonl").read_text().splitlines())}
    assert set(entries) == {*pieces, "jackson-whole"}
    for key, samples in pieces.items():
        wave, rate = load_audio(entries[key]["source"])
        assert rate == 8000 and entries[key]["source_len"] == int(len(samples) / rate * 100)
        # The range holds the digit itself: the same samples (FLAC is lossless), not a neighbour's.
        assert len(wave) == len(samples) and np.array_equal(np.round(wave[:, 0] * 32768).astype(np.int16),
                                                            samples)
    whole = entries["jackson-whole"]
    assert whole["source"] == str(set_dir.parent / "rec1.flac")  # 0 to -1 is the file itself
    assert whole["source_len"] == int(sum(len(pieces[f"jackson-r1-{i}"]) for i in range(3)) / 80)


def test_a_range_past_the_end_is_refused_and_a_short_overshoot_is_rounding() -> None:
    duration = probe_audio(str(DIGITS[0])).duration
    inside = probe_audio(with_range(str(DIGITS[0]), 0.1, duration + 0.005))
    assert inside.frames == round(duration * 8000) - 800  # read to the recording's end
    with pytest.raises(AudioError, match="segment_past_end.*passes the end of its recording"):
        probe_audio(with_range(str(DIGITS[0]), 0.1, duration + 0.5))
    with pytest.raises(AudioError, match="segment_past_end"):
        load_audio(with_range(str(DIGITS[0]), duration + 0.1, duration + 0.2))
    assert split_range(with_range("/a/b.wav", 1.25, None)) == ("/a/b.wav", 1.25, None)
    assert split_range("/a/plain#1.wav") == ("/a/plain#1.wav", None, None)


def test_a_pipe_can_be_segmented_too(tmp_path: Path) -> None:
    pipe = f"cat {DIGITS[1]} |"
    wave, rate = load_audio(with_range(pipe, 0.05, 0.15))
    assert rate == 8000 and len(wave) == 800
