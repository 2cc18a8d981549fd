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
from pathlib import Path

import pytest

from funasr_recipe.data.corpus import read_corpus_info
from recipes.aishell1.prepare import prepare as prepare_aishell1
from recipes.fsdd import BUNDLED
from recipes.fsdd.prepare import prepare as prepare_fsdd
from recipes.librispeech.prepare import prepare as prepare_librispeech
from recipes.mandarin_syllables.prepare import prepare as prepare_mandarin
from recipes.speechocean762.prepare import prepare as prepare_speechocean
from tests.helpers.recipe_trees import (
    check_set,
    copy_wav,
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
