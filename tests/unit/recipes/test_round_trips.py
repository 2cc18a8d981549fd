"""Round trips through the tools our users come from: stage 0's data.jsonl read by FunASR's own loader
(funasr's IndexDSJsonl, what its trainer and finetune.sh read), and our Kaldi dirs (with segments) read
by lhotse's Kaldi importer.

Reads real 8 kHz wavs of the bundled digit corpus (joined into one long file for the segments);
writes JSONL, Kaldi dirs and the validator's output under tmp_path.

  python -m pytest -q tests/unit/recipes/test_round_trips.py
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from funasr_recipe.data.validate import validate_set
from recipes.fsdd import BUNDLED, NAME, WORDS
from recipes.jsonl.prepare import prepare as prepare_jsonl
from tests.helpers.recipe_trees import table

SENSEVOICE_FIELDS = ("source", "target", "text_language", "emo_target", "event_target", "with_or_wo_itn")


def clips(speaker: str, n: int) -> list[Path]:
    return sorted((BUNDLED / "recordings").glob(f"*_{speaker}_*.wav"))[:n]


def funasr_line(wav: Path, **kw) -> dict:
    digit, speaker, _ = NAME.match(wav.name).groups()
    return {"key": f"{speaker}-{wav.stem}", "source": str(wav), "source_len": 30, "target": WORDS[int(digit)],
            "target_len": 1, "text_language": "<|en|>", "emo_target": "<|HAPPY|>",
            "event_target": "<|Speech|>", "with_or_wo_itn": "<|withitn|>", **kw}


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_funasr_jsonl_in_and_out_through_funasrs_loader(tmp_path: Path) -> None:
    from funasr.register import tables
    from funasr.utils.load_utils import load_audio_text_image_video

    IndexDSJsonl = tables.index_ds_classes["IndexDSJsonl"]  # the index the SenseVoice configs name

    given = [funasr_line(w) for w in clips("george", 3)] + [funasr_line(w, text_language="<|zh|>",
                                                                        emo_target="<|SAD|>")
                                                           for w in clips("jackson", 3)]
    write_jsonl(tmp_path / "c/train.jsonl", given)
    write_jsonl(tmp_path / "c/val.jsonl", [funasr_line(w) for w in clips("theo", 2)])
    prepare_jsonl(tmp_path / "c", tmp_path / "data")
    assert validate_set(tmp_path / "data/train", nj=1)["accepted"] == 6
    ours = tmp_path / "data/train/data.jsonl"
    loaded = IndexDSJsonl(str(ours), max_source_length=10**6, max_token_length=10**6)
    assert len(loaded) == 6
    by_source = {item["source"]: item for item in (loaded[i] for i in range(len(loaded)))}
    for row in given:  # every SenseVoice field survives FunASR JSONL -> our sets -> FunASR's loader
        item = by_source[row["source"]]
        assert {f: item[f] for f in SENSEVOICE_FIELDS} == {f: row[f] for f in SENSEVOICE_FIELDS}
        assert item["source_len"] > 0 and item["target_len"] > 0  # recomputed from audio and text
    audio = load_audio_text_image_video(given[0]["source"], fs=16000)
    assert audio.numel() == pytest.approx(sf.info(given[0]["source"]).frames * 2, abs=2)


def test_our_kaldi_dir_with_segments_read_by_lhotse(tmp_path: Path) -> None:
    from lhotse import CutSet
    from lhotse.kaldi import load_kaldi_data_dir

    parts, rows, t = [], [], 0.0
    for wav in clips("lucas", 4):
        audio, rate = sf.read(wav, dtype="int16")
        padded = np.pad(audio, (0, -len(audio) % 8))  # whole ms, so that every start is one exactly
        parts += [np.zeros(rate // 5, dtype="int16"), padded]
        t += 0.2
        rows.append(funasr_line(wav, source=str(tmp_path / "long.wav"), start=round(t, 3),
                                end=round(t + len(audio) / rate, 3), speaker="lucas"))
        t += len(padded) / rate
    sf.write(tmp_path / "long.wav", np.concatenate(parts), 8000, subtype="PCM_16")
    write_jsonl(tmp_path / "c/train.jsonl", rows)
    write_jsonl(tmp_path / "c/dev.jsonl", [funasr_line(clips("theo", 1)[0])])
    prepare_jsonl(tmp_path / "c", tmp_path / "data")
    assert (tmp_path / "data/train/segments").is_file()
    recordings, supervisions, _ = load_kaldi_data_dir(tmp_path / "data/train", sampling_rate=8000)
    assert len(recordings) == 1 and recordings[0].duration == pytest.approx(t, abs=1e-3)
    assert supervisions is not None
    got = {s.id: s for s in supervisions}
    text = table(tmp_path / "data/train/text")
    for row in rows:
        sup = got[row["key"]]
        assert (sup.recording_id, sup.speaker, sup.text) == (recordings[0].id, "lucas", text[row["key"]])
        assert (sup.start, sup.end) == pytest.approx((row["start"], row["end"]), abs=1e-3)
    # lhotse reads the very samples of each range (the clip it was joined from).
    cuts = CutSet.from_manifests(recordings=recordings, supervisions=supervisions).trim_to_supervisions()
    cut = next(c for c in cuts if c.supervisions[0].id == rows[1]["key"])
    clip, _ = sf.read(clips("lucas", 4)[1], dtype="float32")
    assert np.abs(cut.load_audio()[0][: len(clip) - 8] - clip[: len(clip) - 8]).max() < 1e-3
