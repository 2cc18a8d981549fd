"""Tests of recipes/lhotse/prepare.py on lhotse manifests built with lhotse's own API from real audio.

Reads real 8 kHz wavs of the bundled digit corpus (a long recording is several of them concatenated,
for supervisions at offsets); writes manifests, Kaldi dirs and the validator's output under tmp_path.

  python -m pytest -q tests/unit/recipes/test_lhotse_recipe.py
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from lhotse import AudioSource, CutSet, Recording, RecordingSet, SupervisionSegment, SupervisionSet
from lhotse.utils import fastcopy

from funasr_recipe.data.validate import validate_set
from recipes.fsdd import BUNDLED, NAME, WORDS
from recipes.lhotse.prepare import prepare
from tests.helpers.recipe_trees import raises, table

REPO = Path(__file__).resolve().parents[3]
GAP = 0.25  # seconds of silence between the clips of the long recording


def fsdd(speaker: str, n: int) -> list[Path]:
    """The first n real wavs of one speaker of the bundled digit corpus."""
    return sorted((BUNDLED / "recordings").glob(f"*_{speaker}_*.wav"))[:n]


def sup_of(rec: Recording, wav: Path, **kw) -> SupervisionSegment:
    """The whole-recording supervision of an FSDD clip: key speaker-stem, text the digit word."""
    digit, speaker, _ = NAME.match(wav.name).groups()
    fields = {"id": f"{speaker}-{rec.id}", "recording_id": rec.id, "start": 0.0, "duration": rec.duration,
              "text": WORDS[int(digit)], "speaker": speaker, "language": "English", **kw}
    return SupervisionSegment(**fields)


def whole_files(wavs: list[Path]) -> tuple[RecordingSet, SupervisionSet]:
    recs = [Recording.from_file(w) for w in wavs]
    return (RecordingSet.from_recordings(recs),
            SupervisionSet.from_segments(sup_of(r, w) for r, w in zip(recs, wavs, strict=True)))


def long_recording(tmp_path: Path, wavs: list[Path]) -> tuple[Recording, list[SupervisionSegment]]:
    """One file of the clips with GAP seconds of silence before each; a supervision per clip at its offset."""
    parts, sups, t = [], [], 0.0
    for wav in wavs:
        audio, rate = sf.read(wav, dtype="int16")
        parts += [np.zeros(int(GAP * rate), dtype="int16"), audio]
        t += GAP
        digit, speaker, _ = NAME.match(wav.name).groups()
        sups.append(SupervisionSegment(id=f"{speaker}-long-{wav.stem}", recording_id="long", start=t,
                                       duration=len(audio) / rate, text=WORDS[int(digit)], speaker=speaker,
                                       language="en-US"))
        t += len(audio) / rate
    sf.write(tmp_path / "long.wav", np.concatenate(parts), rate, subtype="PCM_16")
    return Recording.from_file(tmp_path / "long.wav", recording_id="long"), sups


def segments(set_dir: Path) -> dict[str, tuple[str, float, float]]:
    return {k: (v.split()[0], float(v.split()[1]), float(v.split()[2]))
            for k, v in table(set_dir / "segments").items()}


def test_recordings_and_supervisions(tmp_path: Path) -> None:
    corpus = tmp_path / "manifests"
    corpus.mkdir()
    for split, speakers in {"train": ("george", "jackson", "lucas"), "dev-clean": ("nicolas",),
                            "test-clean": ("theo",)}.items():
        recs, sups = whole_files([w for s in speakers for w in fsdd(s, 3)])
        ext = ".jsonl" if split == "test-clean" else ".jsonl.gz"  # both forms of lhotse's JSONL
        recs.to_file(corpus / f"digits_recordings_{split}{ext}")
        sups.to_file(corpus / f"digits_supervisions_{split}{ext}")
    info = prepare(corpus, tmp_path / "data")
    assert (info.corpus, info.train_set, info.valid_set, info.test_sets) == (
        "lhotse", "train", "dev-clean", ["dev-clean", "test-clean"])
    written = json.loads((tmp_path / "data/corpus.json").read_text())["sets"]
    assert written == ["dev-clean", "test-clean", "train"]
    train = tmp_path / "data/train"
    wav = table(train / "wav.scp")
    first = fsdd("george", 1)[0]
    assert wav[f"george-{first.stem}"] == str(first.resolve())  # whole files: keyed by utterance
    assert not (train / "segments").exists()
    assert table(train / "text")[f"george-{first.stem}"] == WORDS[int(first.name[0])]
    assert set(table(train / "utt2lang").values()) == {"English"}  # as given; the validator maps it
    assert set(table(train / "utt2spk").values()) == {"george", "jackson", "lucas"}
    for name, n in (("train", 9), ("dev-clean", 3), ("test-clean", 3)):
        report = validate_set(tmp_path / "data" / name, nj=1)
        assert (report["accepted"], report["rejected"]) == (n, 0), report
    line = json.loads((train / "data.jsonl").read_text().splitlines()[0])
    assert line["text_language"] == "<|en|>" and line["speaker"] == "george"


def test_cuts_with_segments(tmp_path: Path) -> None:
    rec, sups = long_recording(tmp_path, fsdd("lucas", 4))
    short, short_sups = whole_files(fsdd("george", 2) + fsdd("jackson", 2))
    # Cuts of one supervision each (cut.start is the offset, supervision start 0 relative to it), and
    # whole-recording cuts of the short clips.
    long_cuts = CutSet.from_manifests(RecordingSet.from_recordings([rec]), SupervisionSet.from_segments(sups))
    cuts = long_cuts.trim_to_supervisions(keep_overlapping=False) + CutSet.from_manifests(short, short_sups)
    assert any(c.start > 0 and c.supervisions[0].start == 0 for c in cuts)
    (tmp_path / "m").mkdir()
    cuts.to_file(tmp_path / "m" / "digits_cuts_train.jsonl.gz")
    info = prepare(tmp_path / "m", tmp_path / "data", dev_speakers=1)
    assert info.valid_set == "dev" and info.test_sets == ["dev"]
    train = segments(tmp_path / "data/train")
    for sup in sups:  # absolute times in the recording, to the ms
        assert train[sup.id] == ("long", round(sup.start, 3), round(sup.end, 3))
    assert sups[1].start == pytest.approx(2 * GAP + sf.info(fsdd("lucas", 1)[0]).duration)
    for sup in short_sups[:2]:  # whole files in a set with segments get their explicit range, never -1
        assert train[sup.id] == (sup.recording_id, 0.0, round(sup.duration, 3))
    wav = table(tmp_path / "data/train/wav.scp")
    assert wav["long"] == str((tmp_path / "long.wav").resolve())  # keyed by recording
    assert set(wav) == {"long", *(s.recording_id for s in short_sups[:2])}
    # dev (jackson's whole files only) needs no segments: wav.scp keyed by utterance.
    assert not (tmp_path / "data/dev/segments").exists()
    assert set(table(tmp_path / "data/dev/wav.scp")) == {s.id for s in short_sups[2:]}
    assert set(table(tmp_path / "data/train/utt2lang").values()) <= {"English", "en-US"}
    total = 0
    for name in ("train", "dev"):
        report = validate_set(tmp_path / "data" / name, nj=1)
        assert report["rejected"] == 0, (tmp_path / "data" / name / "rejected.tsv").read_text()
        total += report["accepted"]
    assert total == 8
    durations = {json.loads(line)["key"]: json.loads(line)["source_len"] for name in ("train", "dev")
                 for line in (tmp_path / "data" / name / "data.jsonl").read_text().splitlines()}
    assert durations[sups[2].id] == int(sups[2].duration * 100)  # the range's length, not the file's


def test_overlapping_cuts_give_each_supervision_once(tmp_path: Path, caplog) -> None:
    rec, sups = long_recording(tmp_path, fsdd("theo", 2))
    # A third supervision over the end of the first clip and the start of the second: with
    # keep_overlapping=True each cut carries its neighbours too, at times relative to that cut.
    sups.append(fastcopy(sups[0], id="theo-long-overlap", start=sups[0].start + 0.1,
                         duration=sups[1].end - sups[0].start - 0.2))
    cuts = CutSet.from_manifests(RecordingSet.from_recordings([rec]), SupervisionSet.from_segments(sups))
    cuts = cuts.trim_to_supervisions(keep_overlapping=True)
    assert sum(len(c.supervisions) for c in cuts) > 3
    (tmp_path / "m").mkdir()
    cuts.to_file(tmp_path / "m" / "x_cuts_train.jsonl")
    cuts.subset(first=1).to_file(tmp_path / "m" / "x_cuts_dev.jsonl")
    prepare(tmp_path / "m", tmp_path / "data")
    got = segments(tmp_path / "data/train")
    assert got == {s.id: ("long", round(s.start, 3), round(s.end, 3)) for s in sups}
    assert "taken once" in caplog.text


def test_channels_pipes_and_relative_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = fsdd("nicolas", 2)
    x, y = sf.read(a, dtype="int16")[0], sf.read(b, dtype="int16")[0]
    n = min(len(x), len(y))
    (tmp_path / "audio").mkdir()
    sf.write(tmp_path / "audio/stereo.wav", np.stack([x[:n], y[:n]], axis=1), 8000, subtype="PCM_16")
    monkeypatch.chdir(tmp_path)
    stereo = Recording.from_file("audio/stereo.wav")  # a relative path: lhotse reads it from the cwd
    assert stereo.sources[0].source == "audio/stereo.wav" and stereo.channel_ids == [0, 1]
    piped = fastcopy(Recording.from_file(a), id="piped")
    piped = fastcopy(piped, sources=[AudioSource(type="command", channels=[0], source=f"cat {a}")])
    sups = [sup_of(stereo, a, id="nicolas-stereo", channel=[0, 1]), sup_of(piped, a, id="nicolas-piped")]
    mono = whole_files(fsdd("theo", 2))
    (tmp_path / "m").mkdir()
    (mono[0] + RecordingSet.from_recordings([stereo, piped])).to_file("m/d_recordings_train.jsonl.gz")
    (mono[1] + SupervisionSet.from_segments(sups)).to_file("m/d_supervisions_train.jsonl.gz")
    prepare(Path("m"), Path("data"))
    wav = {**table(tmp_path / "data/train/wav.scp"), **table(tmp_path / "data/dev/wav.scp")}
    assert wav["nicolas-stereo"] == str(tmp_path / "audio/stereo.wav")
    assert wav["nicolas-piped"] == f"cat {a} |"
    accepted = sum(validate_set(tmp_path / "data" / s, nj=1, allow_pipes=True)["accepted"]
                   for s in ("train", "dev"))
    assert accepted == 4
    # One channel of the stereo file cannot be selected.
    SupervisionSet.from_segments([sup_of(stereo, a, id="nicolas-left", channel=0)]).to_file(
        "m/d_supervisions_train.jsonl.gz")
    with raises("supervision nicolas-left is on channel(s) [0] of the 2-channel recording stereo"):
        prepare(Path("m"), Path("data"))


def bad_corpus(tmp_path: Path, recs: list[Recording], sups: list[SupervisionSegment]) -> Path:
    (tmp_path / "m").mkdir(exist_ok=True)
    RecordingSet.from_recordings(recs).to_file(tmp_path / "m/c_recordings_train.jsonl.gz")
    SupervisionSet.from_segments(sups).to_file(tmp_path / "m/c_supervisions_train.jsonl.gz")
    return tmp_path / "m"


def test_what_cannot_be_written_stops_naming_it(tmp_path: Path) -> None:
    wav = fsdd("george", 1)[0]
    rec = Recording.from_file(wav)
    url = fastcopy(rec, sources=[AudioSource(type="url", channels=[0], source="https://example.org/a.wav")])
    with raises(f"recording {rec.id}: an audio source of type 'url' is not supported"):
        prepare(bad_corpus(tmp_path, [url], [sup_of(rec, wav)]), tmp_path / "data")
    fast = rec.perturb_speed(1.1, affix_id=False)
    with raises(f"recording {rec.id} has the transforms ['Speed']"):
        prepare(bad_corpus(tmp_path, [fast], [sup_of(rec, wav)]), tmp_path / "data")
    orphan = sup_of(rec, wav, id="george-orphan", recording_id="nowhere")
    with raises("1 supervisions are of recordings that c_recordings_train.jsonl.gz does not have: "
                "george-orphan (nowhere)"):
        prepare(bad_corpus(tmp_path, [rec], [sup_of(rec, wav), orphan]), tmp_path / "data")
    cut = CutSet.from_manifests(RecordingSet.from_recordings([rec]),
                                SupervisionSet.from_segments([sup_of(rec, wav)]))[0]
    CutSet.from_cuts([cut.pad(duration=rec.duration + 1)]).to_file(tmp_path / "m/c_cuts_train.jsonl.gz")
    with raises("is a MixedCut"):
        prepare(tmp_path / "m", tmp_path / "data")


def test_layout_errors_name_the_directory(tmp_path: Path) -> None:
    corpus = tmp_path / "m"
    corpus.mkdir()
    (corpus / "README.txt").write_text("not a manifest\n")
    with raises(f"no lhotse manifest in {corpus}") as e:
        prepare(corpus, tmp_path / "data")
    assert "found README.txt" in str(e.value)
    recs, sups = whole_files(fsdd("george", 2))
    recs.to_file(corpus / "a_recordings_train.jsonl.gz")
    with raises("split 'train' has a_recordings_train.jsonl.gz but no supervisions manifest"):
        prepare(corpus, tmp_path / "data")
    sups.to_file(corpus / "a_supervisions_train.jsonl.gz")
    sups.to_file(corpus / "b_supervisions_dev.jsonl.gz")
    with raises("several corpora (a b)"):
        prepare(corpus, tmp_path / "data")
    (corpus / "b_supervisions_dev.jsonl.gz").unlink()
    recs.to_file(corpus / "a_recordings_test.jsonl.gz")
    sups.to_file(corpus / "a_supervisions_test.jsonl.gz")
    (corpus / "a_recordings_train.jsonl.gz").rename(corpus / "a_recordings_other.jsonl.gz")
    (corpus / "a_supervisions_train.jsonl.gz").rename(corpus / "a_supervisions_other.jsonl.gz")
    with raises("no train split (named train or train<anything>); the splits are other test"):
        prepare(corpus, tmp_path / "data")
    # The command line: a layout error is one line and exit status 2 (bad input).
    run = subprocess.run([sys.executable, "-m", "recipes.lhotse.prepare", "--corpus-dir", str(corpus),
                          "--data-dir", str(tmp_path / "data")], cwd=REPO, capture_output=True, text=True)
    assert run.returncode == 2 and "no train split" in run.stderr, run.stderr


def test_missing_text_and_speaker_reach_the_validator(tmp_path: Path) -> None:
    wavs = fsdd("jackson", 3) + fsdd("lucas", 3)
    recs = [Recording.from_file(w) for w in wavs]
    sups = [sup_of(r, w) for r, w in zip(recs, wavs, strict=True)]
    sups[0] = fastcopy(sups[0], text=None, speaker=None)
    corpus = bad_corpus(tmp_path, recs, sups)
    SupervisionSet.from_segments(sups[:1]).to_file(corpus / "c_supervisions_dev.jsonl.gz")
    RecordingSet.from_recordings(recs[:1]).to_file(corpus / "c_recordings_dev.jsonl.gz")
    prepare(corpus, tmp_path / "data")
    dev = tmp_path / "data/dev"
    assert table(dev / "text") == {sups[0].id: ""} and table(dev / "utt2spk") == {sups[0].id: sups[0].id}
    report = validate_set(dev, nj=1)
    assert report["rejected_by_reason"] == {"empty_transcript": 1}
    assert validate_set(tmp_path / "data/train", nj=1)["rejected_by_reason"] == {"empty_transcript": 1}
