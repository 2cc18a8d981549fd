"""recipes/kaldi/prepare.py: Kaldi data dirs taken as they are, split into train/dev where needed.

  python -m pytest -q tests/unit/recipes/test_kaldi_recipe.py
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

import pytest

from recipes.kaldi.prepare import pick_dev_speakers
from recipes.kaldi.prepare import prepare as prepare_kaldi
from tests.helpers.recipe_trees import lines, raises, speakers, write_dir

BROKEN_TRAIN = {
    "wav.scp": b"spkA-u1 /abs/a1.wav\nspkA-u2 rel/a2.wav\nspkA-u2 rel/a2-again.wav\n"
               b"spkB-u1 sox in.flac -t wav - |\nspkB-u\xff2 /abs/b2.wav\n",
    "text": b"spkA-u1 HELLO\nspkA-u2 \nspkB-u1 caf\xe9 latin-1\nspkB-u\xff2 WORLD\n",
    "utt2spk": b"spkA-u1 spkA\nspkA-u2 spkA\nspkB-u1 spkB\nspkB-u\xff2 spkB\n",
    "spk2utt": b"spkA spkA-u1 spkA-u2\nspkB spkB-u1 spkB-u\xff2\n",
}


def test_kaldi_sets_are_copied_byte_for_byte(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    corpus = tmp_path / "mine"
    write_dir(corpus / "train", BROKEN_TRAIN)
    write_dir(corpus / "dev", {"wav.scp": b"spkC-u1 /abs/c1.wav\n", "text": b"spkC-u1 ONE\n",
                               "utt2spk": b"spkC-u1 spkC\n"})  # no spk2utt: made from utt2spk
    write_dir(corpus / "test", {"wav.scp": b"spkD-u1 /abs/d1.wav", "text": b"spkD-u1 TWO\n",
                                "utt2spk": b"spkD-u1 spkD\n", "spk2utt": b"spkD spkD-u1\n",
                                "utt2lang": b"spkD-u1 zh\n", "notes.txt": b"not copied\n"})
    (corpus / "exp").mkdir()  # no wav.scp: not a set
    stale = write_dir(tmp_path / "data/train", {"utt2emo": b"old run\n"})
    caplog.set_level(logging.INFO)
    info = prepare_kaldi(corpus, tmp_path / "data", language="zh", emotion="HAPPY", itn="withitn")
    for name, data in BROKEN_TRAIN.items():
        assert (tmp_path / "data/train" / name).read_bytes() == data
    assert not (stale / "utt2emo").exists()
    assert (tmp_path / "data/dev" / "spk2utt").read_bytes() == b"spkC spkC-u1\n"
    for name in ("wav.scp", "text", "utt2spk", "spk2utt", "utt2lang"):
        assert (tmp_path / "data/test" / name).read_bytes() == (corpus / "test" / name).read_bytes()
    assert not (tmp_path / "data/test" / "notes.txt").exists()
    assert not (tmp_path / "data/exp").exists()
    assert (info.train_set, info.valid_set, info.test_sets, info.sets) == ("train", "dev", ["dev", "test"],
                                                                           ["dev", "test", "train"])
    assert (info.language, info.emotion, info.event, info.itn) == ("zh", "HAPPY", "Speech", "withitn")
    assert any("train: 5 utterances, 2 speakers" in r.getMessage() for r in caplog.records)


def test_kaldi_sets_in_place_valid_name_and_no_dev(tmp_path: Path) -> None:
    data = tmp_path / "data"
    write_dir(data / "train", BROKEN_TRAIN)
    write_dir(data / "valid", {k: v for k, v in BROKEN_TRAIN.items() if k != "spk2utt"})
    info = prepare_kaldi(data, data)  # the user's data/ already is the data dir
    for name, raw in BROKEN_TRAIN.items():
        assert (data / "train" / name).read_bytes() == raw
    assert (data / "valid" / "spk2utt").read_bytes() == BROKEN_TRAIN["spk2utt"]
    assert (info.valid_set, info.test_sets) == ("valid", ["valid"])
    write_dir(tmp_path / "mine" / "train", BROKEN_TRAIN)  # no dev set beside train: speakers held out
    write_dir(tmp_path / "mine" / "eval", {"wav.scp": b"x /abs/x.wav\n"})
    info = prepare_kaldi(tmp_path / "mine", tmp_path / "out")
    assert (info.valid_set, info.test_sets) == ("dev", ["dev", "eval"])
    assert speakers(tmp_path / "out/dev") == {"spkB"}


def test_kaldi_single_dir_is_split_by_speaker(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    spks = [f"spk{i:02d}" for i in range(8)]
    utts = [f"{s}-u{j}" for s in spks for j in range(3)]
    files = {
        "wav.scp": "".join(f"{u} /abs/{u}.wav\n" for u in utts).encode() + b"orphan-u1 /abs/o.wav\n"
                   + b"spk03-u\xff9 /abs/bad.wav\nspk03-u0 /abs/duplicate.wav",  # last line: no newline
        "text": "".join(f"{u} WORDS {u}\n" for u in utts).encode() + b"\n" + b"spk03-u\xff9 \n",
        "utt2spk": "".join(f"{u} {u.split('-')[0]}\n" for u in utts).encode() + b"spk03-u\xff9 spk03\n",
        "utt2emo": "".join(f"{u} HAPPY\n" for u in reversed(utts)).encode(),
    }
    corpus = write_dir(tmp_path / "one", files)
    caplog.set_level(logging.INFO)
    info = prepare_kaldi(corpus, tmp_path / "data", dev_speakers=2)
    train, dev = tmp_path / "data/train", tmp_path / "data/dev"
    assert speakers(dev) == {"spk02", "spk06"}  # 8 speakers, 2 picks: middles of spk00-03 and spk04-07
    assert speakers(train).isdisjoint(speakers(dev))
    for name in files:
        original = lines(corpus / name)
        got_train, got_dev = lines(train / name), lines(dev / name)
        assert Counter(got_train + got_dev) == Counter(original)  # every line, bytes unchanged
        assert got_train == [ln for ln in original if ln in set(got_train)]  # original order kept
        assert got_dev == [ln for ln in original if ln.split(b" ")[0].split(b"-")[0] in (b"spk02", b"spk06")]
    assert b"orphan-u1 /abs/o.wav" in lines(train / "wav.scp")  # no speaker: stays in train
    assert b"spk03-u0 /abs/duplicate.wav" in lines(train / "wav.scp")
    assert (dev / "spk2utt").read_bytes() == (b"spk02 spk02-u0 spk02-u1 spk02-u2\n"
                                              b"spk06 spk06-u0 spk06-u1 spk06-u2\n")
    assert (info.train_set, info.valid_set, info.test_sets) == ("train", "dev", ["dev"])
    assert any("dev: 6 utterances, 2 speakers" in r.getMessage() for r in caplog.records)
    prepare_kaldi(corpus, tmp_path / "data2")  # default: max(1, round(5% of 8)) = 1 speaker, the middle one
    assert speakers(tmp_path / "data2/dev") == {"spk04"}
    spks = [f"s{i:03d}".encode() for i in range(100)]
    assert pick_dev_speakers(spks[::-1], None) == pick_dev_speakers(spks, 5)
    assert len(pick_dev_speakers(spks, 5)) == 5 and len(pick_dev_speakers(spks, 99)) == 99


def test_kaldi_one_speaker_or_none_is_split_by_utterance_with_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    utts = [f"anna-{j:02d}" for j in range(40)]
    files = {"wav.scp": "".join(f"{u} /abs/{u}.wav\n" for u in utts).encode(),
             "text": "".join(f"{u} WORDS\n" for u in utts).encode(),
             "utt2spk": "".join(f"{u} anna\n" for u in utts).encode()}
    for with_speakers in (True, False):
        corpus = write_dir(tmp_path / f"one{with_speakers}", {k: v for k, v in files.items()
                                                              if with_speakers or k != "utt2spk"})
        caplog.clear()
        caplog.set_level(logging.INFO)
        prepare_kaldi(corpus, tmp_path / f"data{with_speakers}")
        train, dev = (lines(tmp_path / f"data{with_speakers}" / s / "wav.scp") for s in ("train", "dev"))
        assert [ln.split()[0] for ln in dev] == [b"anna-10", b"anna-30"] and len(train) == 38
        warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warned) == 1 and "not speaker-disjoint" in warned[0], warned  # no false warning


def test_kaldi_segments_go_with_their_utterances_and_recordings_to_both(tmp_path: Path) -> None:
    spks = [f"spk{i}" for i in range(4)]
    utts = [f"{s}-u{j}" for s in spks for j in range(2)]
    files = {"wav.scp": b"recA /abs/a.flac\nrecB /abs/b.flac\n",
             "segments": "".join(f"{u} rec{'AB'[n % 2]} {n}.0 {n}.5\n" for n, u in enumerate(utts)).encode(),
             "text": "".join(f"{u} WORDS\n" for u in utts).encode(),
             "utt2spk": "".join(f"{u} {u.split('-')[0]}\n" for u in utts).encode()}
    prepare_kaldi(write_dir(tmp_path / "one", files), tmp_path / "data", dev_speakers=1)
    for name in ("train", "dev"):
        assert (tmp_path / "data" / name / "wav.scp").read_bytes() == files["wav.scp"]
    assert [ln.split()[0] for ln in lines(tmp_path / "data/dev/segments")] == [b"spk2-u0", b"spk2-u1"]
    assert len(lines(tmp_path / "data/train/segments")) == 6


def test_kaldi_errors(tmp_path: Path) -> None:
    with raises("wav.scp"):
        prepare_kaldi(tmp_path, tmp_path / "data")  # empty directory
    with raises("expected a directory"):
        prepare_kaldi(tmp_path / "missing", tmp_path / "data")
    write_dir(tmp_path / "sets" / "dev", BROKEN_TRAIN)
    with raises(tmp_path / "sets" / "train" / "wav.scp"):
        prepare_kaldi(tmp_path / "sets", tmp_path / "data")
    one = write_dir(tmp_path / "one", {"wav.scp": b"a-1 /x.wav\n", "utt2spk": b"a-1 a\n"})
    with raises("cannot hold out a dev set from 1 utterance"):
        prepare_kaldi(one, tmp_path / "data")
    (one / "utt2spk").unlink()
    with raises("cannot hold out a dev set from 1 utterance"):
        prepare_kaldi(one, tmp_path / "data")
    with raises("has 0 speaker(s) to hold out"):
        prepare_kaldi(one, tmp_path / "data", dev_speakers=1)
    data = tmp_path / "inplace"
    write_dir(data / "train", BROKEN_TRAIN)
    with raises("would overwrite"):
        prepare_kaldi(data, data)
    assert (data / "train" / "wav.scp").read_bytes() == BROKEN_TRAIN["wav.scp"]
