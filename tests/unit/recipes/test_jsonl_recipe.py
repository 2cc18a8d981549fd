"""Tests of recipes/jsonl/prepare.py on FunASR fine-tuning JSONL over real audio.

Reads real 8 kHz wavs of the bundled digit corpus (joined into one long file for start/end ranges);
writes JSONL, Kaldi dirs and the validator's output under tmp_path.

  python -m pytest -q tests/unit/recipes/test_jsonl_recipe.py
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from funasr_recipe.data.validate import validate_set
from recipes.fsdd import BUNDLED, NAME, WORDS
from recipes.jsonl.prepare import prepare
from tests.helpers.recipe_trees import raises, table

REPO = Path(__file__).resolve().parents[3]


def line(wav: Path, **kw) -> dict:
    """A line as FunASR's sensevoice2jsonl writes it (no speaker) for one bundled digit clip."""
    digit, speaker, _ = NAME.match(wav.name).groups()
    return {"key": f"{speaker}-{wav.stem}", "source": str(wav), "source_len": 31, "target": WORDS[int(digit)],
            "target_len": 1, "text_language": "<|en|>", "emo_target": "<|NEUTRAL|>",
            "event_target": "<|Speech|>", "with_or_wo_itn": "<|woitn|>", **kw}


def clips(speaker: str, n: int) -> list[Path]:
    return sorted((BUNDLED / "recordings").glob(f"*_{speaker}_*.wav"))[:n]


def write(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    path.write_bytes(gzip.compress(text.encode()) if path.suffix == ".gz" else text.encode())
    return path


def test_funasr_train_and_val_keep_every_field(tmp_path: Path) -> None:
    corpus = tmp_path / "c"
    write(corpus / "train.jsonl", [line(w) for s in ("george", "jackson") for w in clips(s, 3)])
    val = [line(w, with_or_wo_itn="<|withitn|>", text_language="zh", speaker="theo")
           for w in clips("theo", 2)]
    write(corpus / "val.jsonl.gz", val)
    write(corpus / "test_other.jsonl", [line(w, text_language="English") for w in clips("lucas", 2)])
    info = prepare(corpus, tmp_path / "data")
    assert (info.corpus, info.valid_set, info.test_sets) == ("jsonl", "val", ["test_other", "val"])
    train, dev = tmp_path / "data/train", tmp_path / "data/val"
    assert set(table(train / "utt2itn").values()) == {"woitn"}
    assert set(table(dev / "utt2itn").values()) == {"withitn"}
    assert set(table(dev / "utt2lang").values()) == {"zh"}
    assert set(table(dev / "utt2spk").values()) == {"theo"}
    assert table(train / "utt2spk") == {k: k for k in table(train / "text")}  # no speaker: its own
    assert table(train / "wav.scp")[line(clips("george", 1)[0])["key"]] == str(clips("george", 1)[0])
    for name, n in (("train", 6), ("val", 2), ("test_other", 2)):
        assert validate_set(tmp_path / "data" / name, nj=1)["accepted"] == n
    out = [json.loads(x) for x in (dev / "data.jsonl").read_text().splitlines()]
    assert {(o["text_language"], o["with_or_wo_itn"], o["speaker"]) for o in out} == {
        ("<|zh|>", "<|withitn|>", "theo")}
    other = (tmp_path / "data/test_other/data.jsonl").read_text().splitlines()
    assert {json.loads(x)["text_language"] for x in other} == {"<|en|>"}  # "English", mapped


def test_ranges_of_a_long_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    parts, rows, t = [], [], 0.0
    for wav in clips("nicolas", 3):
        audio, rate = sf.read(wav, dtype="int16")
        parts += [np.zeros(rate // 4, dtype="int16"), audio]
        t += 0.25
        rows.append(line(wav, source="long.wav", start=round(t, 4), end=round(t + len(audio) / rate, 4),
                         speaker="nicolas"))
        t += len(audio) / rate
    sf.write(tmp_path / "long.wav", np.concatenate(parts), 8000, subtype="PCM_16")
    rows.append(line(clips("lucas", 1)[0], speaker="lucas"))  # a whole file in the same set
    rows.append({**rows[0], "key": "nicolas-past", "start": t - 0.1, "end": t + 5.0})
    write(tmp_path / "c/train.jsonl", rows)
    write(tmp_path / "c/dev.jsonl", [line(clips("theo", 1)[0])])
    monkeypatch.chdir(tmp_path)  # relative sources are relative to the working directory, as funasr's
    prepare(Path("c"), Path("data"))
    train = tmp_path / "data/train"
    segs = {k: v.split() for k, v in table(train / "segments").items()}
    rec = segs[rows[0]["key"]][0]
    assert table(train / "wav.scp")[rec] == str(tmp_path / "long.wav")
    assert segs[rows[1]["key"]][1:] == [f"{rows[1]['start']:.3f}", f"{rows[1]['end']:.3f}"]
    assert segs[rows[3]["key"]][1:] == ["0.000", "-1.000"]  # the whole file: Kaldi's "to the end"
    report = validate_set(train, nj=1)
    assert (report["accepted"], report["rejected_by_reason"]) == (4, {"segment_past_end": 1}), report
    frames = {json.loads(x)["key"]: json.loads(x)["source_len"] for x in (train / "data.jsonl").open()}
    assert frames[rows[1]["key"]] == pytest.approx((rows[1]["end"] - rows[1]["start"]) * 100, abs=1)


def test_held_out_dev_and_what_the_validator_rejects(tmp_path: Path, caplog) -> None:
    rows = [line(w) for s in ("george", "jackson") for w in clips(s, 20)]
    rows[0] = {k: v for k, v in rows[0].items() if k != "target"}
    rows[1]["source"] = str(tmp_path / "gone.wav")
    rows[2]["text_language"] = "<|xx|>"
    rows[3]["prompt"] = "asr"
    write(tmp_path / "c/train.jsonl.gz", rows)
    info = prepare(tmp_path / "c", tmp_path / "data")
    assert info.valid_set == "dev"
    assert "not speaker-disjoint" in caplog.text  # no speakers: dev by utterance, with a warning
    assert "fields not used for training: prompt (1 lines)" in caplog.text
    n_dev = len(table(tmp_path / "data/dev/text"))
    assert n_dev == 2 and len(table(tmp_path / "data/train/text")) == 38
    reasons: dict[str, int] = {}
    for name in ("train", "dev"):
        for reason, n in validate_set(tmp_path / "data" / name, nj=1)["rejected_by_reason"].items():
            reasons[reason] = reasons.get(reason, 0) + n
    assert reasons == {"empty_transcript": 1, "missing_file": 1, "unknown_language": 1}
    # With speakers, dev is speaker-disjoint.
    write(tmp_path / "c/train.jsonl.gz", [line(w, speaker=w.name.split("_")[1]) for w in clips("george", 3)
                                         + clips("jackson", 3) + clips("lucas", 3)])
    prepare(tmp_path / "c", tmp_path / "data", dev_speakers=1)
    assert set(table(tmp_path / "data/dev/utt2spk").values()) == {"jackson"}


def test_layout_errors_name_file_and_line(tmp_path: Path) -> None:
    corpus = tmp_path / "c"
    write(corpus / "val.jsonl", [line(clips("theo", 1)[0])])
    with raises(f"expected {corpus / 'train.jsonl'} (or train.jsonl.gz)"):
        prepare(corpus, tmp_path / "data")
    write(corpus / "train.jsonl", [line(clips("theo", 1)[0])])
    write(corpus / "train.jsonl.gz", [line(clips("theo", 1)[0])])
    with raises("both train.jsonl and train.jsonl.gz; keep one"):
        prepare(corpus, tmp_path / "data")
    (corpus / "train.jsonl.gz").unlink()
    write(corpus / "train.jsonl", [line(clips("theo", 1)[0]), line(clips("theo", 2)[1], key="theo 2")])
    with raises(f"{corpus / 'train.jsonl'}:2: key must be a string without whitespace, not 'theo 2'"):
        prepare(corpus, tmp_path / "data")
    write(corpus / "train.jsonl", [line(clips("theo", 1)[0], start=0.1, end="soon")])
    with raises(f"{corpus / 'train.jsonl'}:1: end must be a number of seconds, not 'soon'"):
        prepare(corpus, tmp_path / "data")
    (corpus / "train.jsonl").write_text('{"key": "a", "source": "x.wav"}\n[1, 2]\n')
    run = subprocess.run([sys.executable, "-m", "recipes.jsonl.prepare", "--corpus-dir", str(corpus),
                          "--data-dir", str(tmp_path / "data")], cwd=REPO, capture_output=True, text=True)
    assert run.returncode == 2 and f"{corpus / 'train.jsonl'}:2: not a JSON object" in run.stderr, run.stderr
