"""Tests of recipes/audiofolder/prepare.py: Hugging Face audiofolder and LJSpeech layouts of real audio.

Reads real 8 kHz wavs of the bundled digit corpus (linked into the folders); writes metadata, Kaldi
dirs and the validator's output under tmp_path.

  python -m pytest -q tests/unit/recipes/test_audiofolder_recipe.py
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from funasr_recipe.data.validate import validate_set
from recipes.audiofolder.prepare import prepare
from recipes.fsdd import BUNDLED, NAME, WORDS
from tests.helpers.recipe_trees import raises, table

REPO = Path(__file__).resolve().parents[3]


def clips(speaker: str, n: int) -> list[Path]:
    return sorted((BUNDLED / "recordings").glob(f"*_{speaker}_*.wav"))[:n]


def link(folder: Path, wav: Path, name: str | None = None) -> str:
    """Link a clip into folder/audio/; its file_name relative to folder."""
    (folder / "audio").mkdir(parents=True, exist_ok=True)
    (folder / "audio" / (name or wav.name)).symlink_to(wav)
    return f"audio/{name or wav.name}"


def test_split_folders_with_quoted_csv_and_jsonl(tmp_path: Path) -> None:
    train, dev = tmp_path / "af/train", tmp_path / "af/validation"
    rows = ["file_name,transcription,speaker_id,locale"]
    for wav in clips("george", 3) + clips("jackson", 3):
        digit, speaker, _ = NAME.match(wav.name).groups()
        rows.append(f'{link(train, wav)},"{WORDS[int(digit)]}, REALLY",{speaker},en-US')
    # A quoted line break inside a field.
    rows.append(f'{link(train, clips("lucas", 1)[0])},"SAID ""ZERO""\nTWICE",lucas,en-US')
    (train / "metadata.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    dev.mkdir(parents=True)
    objs = [{"file_name": link(dev, w), "text": "X", "speaker": "theo"} for w in clips("theo", 2)]
    (dev / "metadata.jsonl").write_text("".join(json.dumps(o) + "\n" for o in objs))
    info = prepare(tmp_path / "af", tmp_path / "data")
    assert (info.corpus, info.valid_set, info.test_sets) == ("audiofolder", "validation", ["validation"])
    text = table(tmp_path / "data/train/text")
    first = clips("george", 1)[0]
    assert text[first.stem] == f"{WORDS[int(first.name[0])]}, REALLY"  # the quoted comma kept
    assert text[clips("lucas", 1)[0].stem] == 'SAID "ZERO" TWICE'
    assert set(table(tmp_path / "data/train/utt2lang").values()) == {"en-US"}
    assert table(tmp_path / "data/train/utt2spk")[first.stem] == "george"
    assert table(tmp_path / "data/train/wav.scp")[first.stem] == str(train / "audio" / first.name)
    assert validate_set(tmp_path / "data/train", nj=1)["accepted"] == 7
    assert validate_set(tmp_path / "data/validation", nj=1)["accepted"] == 2


def test_one_metadata_one_speaker_gets_a_dev_by_utterance(tmp_path: Path, caplog) -> None:
    folder = tmp_path / "af"
    rows = ["file_name,text"] + [f"{link(folder, w)},{WORDS[int(w.name[0])]}" for w in clips("nicolas", 40)]
    rows.append("audio/gone.wav,ONE")
    rows.append(f"{link(folder, clips('theo', 1)[0])},")
    (folder / "metadata.csv").write_text("\n".join(rows) + "\n")
    info = prepare(folder, tmp_path / "data")
    assert info.valid_set == "dev" and "not speaker-disjoint" in caplog.text
    assert "cannot hold out" not in caplog.text
    reasons: dict[str, int] = {}
    total = 0
    for name in ("train", "dev"):
        report = validate_set(tmp_path / "data" / name, nj=1)
        total += report["accepted"]
        for reason, n in report["rejected_by_reason"].items():
            reasons[reason] = reasons.get(reason, 0) + n
    assert total == 40 and reasons == {"missing_file": 1, "empty_transcript": 1}


def test_ljspeech_metadata(tmp_path: Path) -> None:
    folder = tmp_path / "LJSpeech-1.1"
    (folder / "wavs").mkdir(parents=True)
    lines = []
    for i, wav in enumerate(clips("lucas", 30)):
        (folder / "wavs" / f"LJ001-{i:04d}.wav").symlink_to(wav)
        raw = f'Printing, "in the only sense" {i}'
        lines.append(f"LJ001-{i:04d}|{raw}|{raw.replace(str(i), 'number')}" if i else f"LJ001-{i:04d}|{raw}|")
    (folder / "metadata.csv").write_text("\n".join(lines) + "\n")
    prepare(folder, tmp_path / "data")
    text = {**table(tmp_path / "data/train/text"), **table(tmp_path / "data/dev/text")}
    assert len(text) == 30
    assert text["LJ001-0000"] == 'Printing, "in the only sense" 0'  # no normalized text: the raw one
    assert text["LJ001-0001"] == 'Printing, "in the only sense" number'
    assert set(table(tmp_path / "data/train/utt2spk").values()) == {"ljspeech"}
    assert sum(validate_set(tmp_path / "data" / s, nj=1)["accepted"] for s in ("train", "dev")) == 30


def test_layout_errors_name_file_and_line(tmp_path: Path) -> None:
    folder = tmp_path / "af"
    (folder / "train").mkdir(parents=True)
    with raises(f"no metadata.csv or metadata.jsonl in {folder}"):
        prepare(folder, tmp_path / "data")
    (folder / "train/metadata.csv").write_text("path,transcription\na.wav,ONE\n")
    with raises(f"{folder / 'train/metadata.csv'}:2: no file_name column"):
        prepare(folder, tmp_path / "data")
    (folder / "train/metadata.csv").write_text("file_name,label\na.wav,1\n")
    with raises("no transcript column (one of transcription, text"):
        prepare(folder, tmp_path / "data")
    (folder / "train/metadata.csv").write_text("file_name,text\na.wav,ONE\n,TWO\n")
    with raises(f"{folder / 'train/metadata.csv'}:3: an empty file_name"):
        prepare(folder, tmp_path / "data")
    (folder / "train/metadata.jsonl").write_text("{}\n")
    with raises("has both metadata.csv and metadata.jsonl"):
        prepare(folder, tmp_path / "data")
    (folder / "train/metadata.jsonl").unlink()
    (folder / "metadata.csv").write_text("file_name,text\na.wav,ONE\n")
    run = subprocess.run([sys.executable, "-m", "recipes.audiofolder.prepare", "--corpus-dir", str(folder),
                          "--data-dir", str(tmp_path / "data")], cwd=REPO, capture_output=True, text=True)
    assert run.returncode == 2 and "split folders with their own metadata (train)" in run.stderr, run.stderr
