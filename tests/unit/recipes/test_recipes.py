"""Tests of the corpus recipes (recipes/<corpus>/prepare.py) on small trees built from real recordings.

Every tree is laid out as the corpus is upstream, from real wavs of the bundled digit corpus
(FLAC layouts get FLAC written from the same samples). The shared real corpora are used as they are
where ../shared/data exists, and those tests are skipped otherwise.

  python -m pytest -q tests/unit/recipes/test_recipes.py
"""

from __future__ import annotations

import importlib
import json
import logging
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from funasr_recipe.data.corpus import read_corpus_info
from recipes.aishell1.prepare import prepare as prepare_aishell1
from recipes.fsdd import BUNDLED
from recipes.fsdd.prepare import prepare as prepare_fsdd
from recipes.kaldi.prepare import pick_dev_speakers
from recipes.kaldi.prepare import prepare as prepare_kaldi
from recipes.librispeech.prepare import prepare as prepare_librispeech
from recipes.mandarin_syllables.prepare import prepare as prepare_mandarin
from recipes.speechocean762.prepare import prepare as prepare_speechocean
from tests.helpers.recipe_trees import (
    check_set,
    copy_wav,
    lines,
    make_aishell,
    make_librispeech,
    raises,
    speakers,
    table,
    write_dir,
    write_flac,
)

REPO = Path(__file__).resolve().parents[3]
SHARED = REPO.parent / "shared" / "data"


def shared_corpus(name: str) -> Path:
    """A real corpus of ../shared/data, or a skip where this clone has none beside it."""
    corpus = SHARED / name
    if not corpus.is_dir():
        pytest.skip(f"{corpus} is not there (real data shared beside the repo)")
    return corpus
RECIPES = ("kaldi", "fsdd", "speechocean762", "mandarin_syllables", "aishell1", "librispeech")


@pytest.fixture(scope="module")
def wavs() -> list[Path]:
    """Real 8 kHz recordings of the bundled digit corpus, in a fixed order."""
    return sorted((BUNDLED / "recordings").glob("*.wav"))[:40]


def test_fsdd_bundled_corpus(tmp_path: Path) -> None:
    info = prepare_fsdd(BUNDLED, tmp_path / "data")
    assert set(check_set(tmp_path / "data/dev", 500).values()) == {"theo"}
    assert set(check_set(tmp_path / "data/train", 2000).values()) == {"george", "jackson", "lucas", "nicolas"}
    assert table(tmp_path / "data/dev" / "text")["theo-7_theo_3"] == "SEVEN"
    assert table(tmp_path / "data/train" / "text")["jackson-0_jackson_12"] == "ZERO"
    assert table(tmp_path / "data/train" / "wav.scp")["jackson-7_jackson_3"] == str(
        BUNDLED.resolve() / "recordings" / "7_jackson_3.wav")
    saved = json.loads((tmp_path / "data/corpus.json").read_text())
    assert saved == {"corpus": "fsdd", "corpus_dir": str(BUNDLED.resolve()), "train_set": "train",
                     "valid_set": "dev", "test_sets": ["dev"], "language": "en", "emotion": "NEUTRAL",
                     "event": "Speech", "itn": "woitn", "sets": ["dev", "train"]}
    assert read_corpus_info(tmp_path / "data") == info
    assert all((BUNDLED / name).is_file() for name in ("README.md", "ATTRIBUTION.txt", "LICENSE"))
    assert "CC BY-SA 4.0" in (BUNDLED / "LICENSE").read_text()


def test_fsdd_small_tree_counts_non_matching(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    rec = tmp_path / "fsdd" / "recordings"
    for name in ("7_jackson_3.wav", "0_jackson_0.wav", "9_lucas_49.wav", "3_theo_1.wav", "4_theo_2.wav"):
        copy_wav(BUNDLED / "recordings" / name, rec / name)
    copy_wav(BUNDLED / "recordings" / "1_lucas_1.wav", rec / "1_lucas.wav")  # no index
    (rec / "notes.txt").write_text("not audio\n")
    (rec / "extra").mkdir()
    caplog.set_level(logging.INFO)
    prepare_fsdd(tmp_path / "fsdd", tmp_path / "data", dev_speakers=["theo", "lucas"])
    check_set(tmp_path / "data/train", 2)
    check_set(tmp_path / "data/dev", 3)
    assert table(tmp_path / "data/train" / "text") == {"jackson-0_jackson_0": "ZERO",
                                                            "jackson-7_jackson_3": "SEVEN"}
    warning = next(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert "3 entries" in warning and all(n in warning for n in ("1_lucas.wav", "notes.txt", "extra"))
    assert any("dev: 3 utterances, 2 speakers" in r.getMessage() for r in caplog.records)
    with raises(tmp_path / "recordings"):
        prepare_fsdd(tmp_path, tmp_path / "out")
    with raises("dev speakers ['nobody'] are not in the corpus"):
        prepare_fsdd(tmp_path / "fsdd", tmp_path / "out", dev_speakers=["nobody"])
    with raises("no training speaker"):
        prepare_fsdd(tmp_path / "fsdd", tmp_path / "out", dev_speakers=["jackson", "lucas", "theo"])
    with raises("test speakers ['nobody'] are not in the corpus"):
        prepare_fsdd(tmp_path / "fsdd", tmp_path / "out", test_speakers=["nobody"])
    with raises("both dev and test speakers"):
        prepare_fsdd(tmp_path / "fsdd", tmp_path / "out", dev_speakers=["theo"], test_speakers=["theo"])


def test_fsdd_test_speakers(tmp_path: Path) -> None:
    """A test speaker is held out of training and of checkpoint choice, and decoded as a test set."""
    info = prepare_fsdd(BUNDLED, tmp_path / "data", dev_speakers=["lucas"], test_speakers=["theo"])
    assert set(check_set(tmp_path / "data/test", 500).values()) == {"theo"}
    assert set(check_set(tmp_path / "data/dev", 500).values()) == {"lucas"}
    assert set(check_set(tmp_path / "data/train", 1500).values()) == {"george", "jackson", "nicolas"}
    assert (info.valid_set, info.test_sets, info.sets) == ("dev", ["dev", "test"], ["dev", "test", "train"])
    # dev "none": a tenth of the four training speakers' recordings (indices 0, 10, .., 40 of each digit)
    prepare_fsdd(BUNDLED, tmp_path / "loso", dev_speakers=["none"], test_speakers=["theo"])
    dev = check_set(tmp_path / "loso/dev", 200)
    assert sorted(set(dev.values())) == ["george", "jackson", "lucas", "nicolas"]
    assert all(int(key.rsplit("_", 1)[1]) % 10 == 0 for key in dev)
    assert set(check_set(tmp_path / "loso/train", 1800).values()) == set(dev.values())
    assert set(check_set(tmp_path / "loso/test", 500).values()) == {"theo"}


def test_recipe_cli_fails_clearly_on_wrong_dir(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "recipes.fsdd.prepare", "--corpus-dir", str(tmp_path),
                           "--data-dir", str(tmp_path / "data")], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 2
    assert f"expected FSDD's recordings/ directory at {tmp_path / 'recordings'}" in proc.stderr
    assert "[common.py:" in proc.stderr  # log lines carry [file:line]


@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_help(recipe: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    module = importlib.import_module(f"recipes.{recipe}.prepare")
    monkeypatch.setattr(sys, "argv", [f"recipes.{recipe}.prepare", "--help"])
    with pytest.raises(SystemExit) as exit_info:
        module.main()
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "--corpus-dir" in out and "--data-dir" in out and "python -m recipes." in out


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


@pytest.mark.shared_data
def test_speechocean762_shared(tmp_path: Path) -> None:
    corpus = shared_corpus("speechocean762")
    info = prepare_speechocean(corpus, tmp_path / "data")
    train = check_set(tmp_path / "data/train", 600, speaker_prefix=False)
    dev = check_set(tmp_path / "data/dev", 200, speaker_prefix=False)
    assert len(set(train.values())) == 30 and len(set(dev.values())) == 10
    assert set(train.values()).isdisjoint(dev.values())
    assert table(tmp_path / "data/train" / "text")["000750005"] == "BORN LIKES GREEN"
    assert table(tmp_path / "data/train" / "wav.scp")["000750005"] == str(
        corpus.resolve() / "WAVE" / "SPEAKER0075" / "000750005.WAV")
    assert (info.train_set, info.valid_set, info.test_sets, info.language) == ("train", "dev", ["dev"], "en")


def test_speechocean762_tree(tmp_path: Path, wavs: list[Path]) -> None:
    corpus = tmp_path / "speechocean762"
    for part, spks in {"train": ("0075", "0131"), "dev": ("0048",)}.items():
        rows = [(f"0{spk}{j:04d}", spk) for spk in spks for j in (5, 15)]  # upstream keys: 000750005
        for wav, (key, spk) in zip(wavs, rows, strict=False):
            copy_wav(wav, corpus / "WAVE" / f"SPEAKER{spk}" / f"{key}.WAV")
        wav_scp = "".join(f"{k}\tWAVE/SPEAKER{s}/{k}.WAV\n" for k, s in rows)
        write_dir(corpus / part, {"wav.scp": wav_scp.encode(),
                                  "text": "".join(f"{k}\tIT'S NOT FISH\n" for k, _ in rows).encode(),
                                  "utt2spk": "".join(f"{k} {s}\n" for k, s in rows).encode()})
    info = prepare_speechocean(corpus, tmp_path / "data")
    train = check_set(tmp_path / "data/train", 4, speaker_prefix=False)
    check_set(tmp_path / "data/dev", 2, speaker_prefix=False)
    assert set(train.values()) == {"0075", "0131"}
    assert table(tmp_path / "data/dev" / "text") == {"000480005": "IT'S NOT FISH",
                                                          "000480015": "IT'S NOT FISH"}
    assert info.sets == ["dev", "train"]
    with raises(corpus / "test"):
        prepare_speechocean(corpus, tmp_path / "data", parts=["train", "test"])
    with raises(tmp_path / "WAVE"):
        prepare_speechocean(tmp_path, tmp_path / "data")


@pytest.mark.shared_data
def test_mandarin_syllables_shared(tmp_path: Path) -> None:
    corpus = shared_corpus("mandarin_syllables")
    info = prepare_mandarin(corpus, tmp_path / "data")
    check_set(tmp_path / "data/train", 1707)
    check_set(tmp_path / "data/dev", 1187)
    assert speakers(tmp_path / "data/dev") == {"gcin_liu"}
    assert table(tmp_path / "data/dev" / "text")["gcin_liu-ê4"] == "ê4"
    assert info.language == "zh"


def test_mandarin_syllables_tree(tmp_path: Path, wavs: list[Path]) -> None:
    corpus = tmp_path / "mandarin_syllables"
    rows = [("cmn_chenwang", "zhong1"), ("cmn_chenwang", "lv4"), ("gcin_liu", "ê4"), ("gcin_liu", "de5")]
    for i, (spk, label) in enumerate(rows):
        write_flac(wavs[i], corpus / "wav" / spk / f"{spk}-{label}.flac")
    write_dir(corpus / "data" / "all", {
        "wav.scp": "".join(f"{s}-{t} wav/{s}/{s}-{t}.flac\n" for s, t in rows).encode(),
        "text": "".join(f"{s}-{t} {t}\n" for s, t in rows).encode(),
        "utt2spk": "".join(f"{s}-{t} {s}\n" for s, t in rows).encode()})
    prepare_mandarin(corpus, tmp_path / "data")
    check_set(tmp_path / "data/train", 2)
    dev = check_set(tmp_path / "data/dev", 2)
    assert set(dev.values()) == {"gcin_liu"}
    assert table(tmp_path / "data/dev" / "text") == {"gcin_liu-de5": "de5", "gcin_liu-ê4": "ê4"}
    assert table(tmp_path / "data/dev" / "wav.scp")["gcin_liu-ê4"] == str(
        corpus.resolve() / "wav" / "gcin_liu" / "gcin_liu-ê4.flac")
    prepare_mandarin(corpus, tmp_path / "data2", dev_speakers=["cmn_chenwang"])
    assert speakers(tmp_path / "data2/dev") == {"cmn_chenwang"}
    with raises(tmp_path / "data/all"):
        prepare_mandarin(tmp_path, tmp_path / "out")
    with open(corpus / "data" / "all" / "text", "ab") as f:
        f.write(b"gcin_liu-a1 caf\xe9\n")  # latin-1: a wrong file, not a line to pass on
    with raises(f"{corpus / 'data/all/text'}:5: byte 3 is not UTF-8"):
        prepare_mandarin(corpus, tmp_path / "out")


def test_aishell1_tree(tmp_path: Path, wavs: list[Path], caplog: pytest.LogCaptureFixture) -> None:
    corpus = make_aishell(tmp_path / "aishell", wavs)
    caplog.set_level(logging.INFO)
    info = prepare_aishell1(corpus, tmp_path / "data")
    train = check_set(tmp_path / "data/train", 4, speaker_prefix=False)
    for name in ("dev", "test"):
        check_set(tmp_path / "data" / name, 2, speaker_prefix=False)
    assert train["BAC009S0002W0122"] == "S0002" and set(train.values()) == {"S0002", "S0003"}
    assert table(tmp_path / "data/dev" / "text")["BAC009S0724W0123"] == "而对楼市成交抑制作用最大的限购"
    warning = next(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert "1 wavs have no line" in warning and "BAC009S0003W0999" in warning
    assert (info.valid_set, info.test_sets, info.language) == ("dev", ["dev", "test"], "zh")
    assert info.corpus_dir == str((corpus / "data_aishell").resolve())
    prepare_aishell1(corpus / "data_aishell", tmp_path / "data2")  # data_aishell/ itself
    for name in ("wav.scp", "text"):
        assert (tmp_path / "data2/test" / name).read_bytes() == (tmp_path / "data/test" / name).read_bytes()
    with raises("aishell_transcript_v0.8.txt"):
        prepare_aishell1(tmp_path, tmp_path / "out")
    shutil.rmtree(corpus / "data_aishell" / "wav" / "test")
    (corpus / "data_aishell" / "wav" / "test").mkdir()
    (corpus / "data_aishell" / "wav" / "S0764.tar.gz").write_bytes(b"")
    with raises("extract the speaker archives first"):
        prepare_aishell1(corpus, tmp_path / "data")


def test_librispeech_tree(tmp_path: Path, wavs: list[Path], caplog: pytest.LogCaptureFixture) -> None:
    corpus = make_librispeech(tmp_path / "ls", wavs)
    caplog.set_level(logging.INFO)
    info = prepare_librispeech(corpus, tmp_path / "data")
    train = check_set(tmp_path / "data/train", 6)
    for name in ("dev", "dev_clean", "test_clean"):
        check_set(tmp_path / "data" / name, 2)
    assert not (tmp_path / "data/test_other").exists()
    assert set(train.values()) == {"103-1240", "103-1241", "1034-121119"}
    assert table(tmp_path / "data/train" / "text")["103-1240-0000"] == "CHAPTER ONE MISSUS RACHEL"
    assert (info.train_set, info.valid_set, info.test_sets) == ("train", "dev", ["dev_clean", "test_clean"])
    assert info.sets == ["dev", "dev_clean", "test_clean", "train"]
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("1 flac files have no transcript" in m and "1272-128104-0009" in m for m in messages)
    assert any("1 transcript lines have no flac" in m and "1089-134686-0007" in m for m in messages)
    info = prepare_librispeech(corpus / "LibriSpeech", tmp_path / "data2",
                               parts=["train-clean-100", "dev-clean"])
    assert info.test_sets == ["dev_clean"]
    with raises(tmp_path / "LibriSpeech" / "train-clean"):
        prepare_librispeech(tmp_path, tmp_path / "data")
    with raises("no dev-"):
        prepare_librispeech(corpus, tmp_path / "data", parts=["train-clean-100", "test-clean"])
    with raises("unknown LibriSpeech parts"):
        prepare_librispeech(corpus, tmp_path / "data", parts=["train-clean-100", "clean"])
