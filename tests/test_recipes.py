"""Tests of the corpus recipes (recipes/<corpus>/prepare.py) on small trees built from real recordings.

Every tree is laid out as the corpus is upstream, from real wavs of the bundled digit corpus
(FLAC layouts get FLAC written from the same samples). The shared real corpora are used as they are
where ../shared/data exists, and those tests are skipped otherwise.

  python -m pytest -q tests/test_recipes.py
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
import soundfile as sf

from recipes.aishell1.prepare import prepare as prepare_aishell1
from recipes.common import CorpusLayoutError, read_corpus_info
from recipes.fsdd.prepare import BUNDLED
from recipes.fsdd.prepare import prepare as prepare_fsdd
from recipes.kaldi.prepare import pick_dev_speakers
from recipes.kaldi.prepare import prepare as prepare_kaldi
from recipes.librispeech.prepare import prepare as prepare_librispeech
from recipes.mandarin_syllables.prepare import prepare as prepare_mandarin
from recipes.speechocean762.prepare import prepare as prepare_speechocean

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"
RECIPES = ("kaldi", "fsdd", "speechocean762", "mandarin_syllables", "aishell1", "librispeech")


def table(path: Path) -> dict[str, str]:
    """A UTF-8 Kaldi table as {key: value}."""
    rows = [line.rstrip("\n").split(" ", 1) for line in path.read_text(encoding="utf-8").splitlines()]
    return {r[0]: r[1] if len(r) > 1 else "" for r in rows}


def check_set(set_dir: Path, n_utts: int, speaker_prefix: bool = True) -> dict[str, str]:
    """Assert the invariants of a written set; returns its utt2spk."""
    keys = [line.split(" ", 1)[0] for line in (set_dir / "wav.scp").read_text(encoding="utf-8").splitlines()]
    assert len(keys) == n_utts
    assert keys == sorted(keys) and len(set(keys)) == len(keys)
    wav, text, utt2spk = table(set_dir / "wav.scp"), table(set_dir / "text"), table(set_dir / "utt2spk")
    assert list(text) == keys and list(utt2spk) == keys
    for path in wav.values():
        assert Path(path).is_absolute() and Path(path).is_file(), path
    spk2utt = {spk: utts.split() for spk, utts in table(set_dir / "spk2utt").items()}
    assert list(spk2utt) == sorted(spk2utt)
    assert {u: s for s, us in spk2utt.items() for u in us} == utt2spk
    if speaker_prefix:
        assert all(key.startswith(spk) for key, spk in utt2spk.items())
    else:  # Kaldi's real rule: sorting by key keeps each speaker's utterances together
        order = list(utt2spk.values())
        runs = [spk for i, spk in enumerate(order) if i == 0 or spk != order[i - 1]]
        assert len(runs) == len(set(runs)), runs
    return utt2spk


def speakers(set_dir: Path) -> set[str]:
    """The speakers of a written set."""
    rows = (set_dir / "utt2spk").read_bytes().splitlines()
    return {row.split()[1].decode() for row in rows if row.strip()}


@pytest.fixture(scope="module")
def wavs() -> list[Path]:
    """Real 8 kHz recordings of the bundled digit corpus, in a fixed order."""
    return sorted((BUNDLED / "recordings").glob("*.wav"))[:40]


def copy_wav(src: Path, dst: Path) -> Path:
    """Copy a real wav to dst (making its directory)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)
    return dst


def write_flac(src: Path, dst: Path) -> Path:
    """Write the samples of a real wav as FLAC at dst."""
    data, rate = sf.read(src, dtype="int16")
    dst.parent.mkdir(parents=True, exist_ok=True)
    sf.write(dst, data, rate, format="FLAC")
    return dst


# ------------------------------------------------------------------------------------------------- fsdd


def test_fsdd_bundled_corpus(tmp_path: Path) -> None:
    info = prepare_fsdd(BUNDLED, tmp_path / "data")
    check_set(tmp_path / "data" / "train", 2000)
    check_set(tmp_path / "data" / "dev", 500)
    assert speakers(tmp_path / "data" / "dev") == {"theo"}
    assert speakers(tmp_path / "data" / "train") == {"george", "jackson", "lucas", "nicolas"}
    assert table(tmp_path / "data" / "dev" / "text")["theo-7_theo_3"] == "SEVEN"
    assert table(tmp_path / "data" / "train" / "text")["jackson-0_jackson_12"] == "ZERO"
    assert table(tmp_path / "data" / "train" / "wav.scp")["jackson-7_jackson_3"] == str(
        BUNDLED.resolve() / "recordings" / "7_jackson_3.wav")
    saved = json.loads((tmp_path / "data" / "corpus.json").read_text())
    assert saved == {"corpus": "fsdd", "corpus_dir": str(BUNDLED.resolve()), "train_set": "train",
                     "valid_set": "dev", "test_sets": ["dev"], "language": "en", "emotion": "NEUTRAL",
                     "event": "Speech", "itn": "woitn", "sets": ["dev", "train"]}
    assert read_corpus_info(tmp_path / "data") == info


def test_fsdd_bundled_copy_is_complete() -> None:
    assert len(list((BUNDLED / "recordings").glob("*.wav"))) == 2500
    for name in ("README.md", "ATTRIBUTION.txt", "LICENSE"):
        assert (BUNDLED / name).is_file()
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
    check_set(tmp_path / "data" / "train", 2)
    check_set(tmp_path / "data" / "dev", 3)
    assert table(tmp_path / "data" / "train" / "text") == {"jackson-0_jackson_0": "ZERO",
                                                            "jackson-7_jackson_3": "SEVEN"}
    warning = next(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert "3 entries" in warning and all(n in warning for n in ("1_lucas.wav", "notes.txt", "extra"))
    assert any("dev: 3 utterances, 2 speakers" in r.getMessage() for r in caplog.records)


def test_fsdd_errors(tmp_path: Path, wavs: list[Path]) -> None:
    with pytest.raises(CorpusLayoutError, match=str(tmp_path / "recordings")):
        prepare_fsdd(tmp_path, tmp_path / "data")
    copy_wav(BUNDLED / "recordings" / "7_jackson_3.wav", tmp_path / "fsdd" / "recordings" / "7_jackson_3.wav")
    with pytest.raises(CorpusLayoutError, match="not in the corpus"):
        prepare_fsdd(tmp_path / "fsdd", tmp_path / "data")  # default dev speaker theo is absent
    with pytest.raises(CorpusLayoutError, match="no training speaker"):
        prepare_fsdd(tmp_path / "fsdd", tmp_path / "data", dev_speakers=["jackson"])


def test_recipe_cli_fails_clearly_on_wrong_dir(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "recipes.fsdd.prepare", "--corpus-dir", str(tmp_path),
                           "--data-dir", str(tmp_path / "data")], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 1
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


# ------------------------------------------------------------------------------------------------ kaldi

BROKEN_TRAIN = {
    "wav.scp": b"spkA-u1 /abs/a1.wav\nspkA-u2 rel/a2.wav\nspkA-u2 rel/a2-again.wav\n"
               b"spkB-u1 sox in.flac -t wav - |\nspkB-u\xff2 /abs/b2.wav\n",
    "text": b"spkA-u1 HELLO\nspkA-u2 \nspkB-u1 caf\xe9 latin-1\nspkB-u\xff2 WORLD\n",
    "utt2spk": b"spkA-u1 spkA\nspkA-u2 spkA\nspkB-u1 spkB\nspkB-u\xff2 spkB\n",
    "spk2utt": b"spkA spkA-u1 spkA-u2\nspkB spkB-u1 spkB-u\xff2\n",
}


def write_dir(path: Path, files: dict[str, bytes]) -> Path:
    """A data dir with the given raw files."""
    path.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (path / name).write_bytes(data)
    return path


def test_kaldi_sets_are_copied_byte_for_byte(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    corpus = tmp_path / "mine"
    write_dir(corpus / "train", BROKEN_TRAIN)
    write_dir(corpus / "dev", {"wav.scp": b"spkC-u1 /abs/c1.wav\n", "text": b"spkC-u1 ONE\n",
                               "utt2spk": b"spkC-u1 spkC\n"})  # no spk2utt: made from utt2spk
    write_dir(corpus / "test", {"wav.scp": b"spkD-u1 /abs/d1.wav", "text": b"spkD-u1 TWO\n",
                                "utt2spk": b"spkD-u1 spkD\n", "spk2utt": b"spkD spkD-u1\n",
                                "utt2lang": b"spkD-u1 zh\n", "notes.txt": b"not copied\n"})
    (corpus / "exp").mkdir()  # no wav.scp: not a set
    stale = write_dir(tmp_path / "data" / "train", {"utt2emo": b"old run\n"})
    caplog.set_level(logging.INFO)
    info = prepare_kaldi(corpus, tmp_path / "data", language="zh", emotion="HAPPY", itn="withitn")
    for name, data in BROKEN_TRAIN.items():
        assert (tmp_path / "data" / "train" / name).read_bytes() == data
    assert not (stale / "utt2emo").exists()
    assert (tmp_path / "data" / "dev" / "spk2utt").read_bytes() == b"spkC spkC-u1\n"
    for name in ("wav.scp", "text", "utt2spk", "spk2utt", "utt2lang"):
        assert (tmp_path / "data" / "test" / name).read_bytes() == (corpus / "test" / name).read_bytes()
    assert not (tmp_path / "data" / "test" / "notes.txt").exists()
    assert not (tmp_path / "data" / "exp").exists()
    assert (info.train_set, info.valid_set, info.test_sets, info.sets) == ("train", "dev", ["dev", "test"],
                                                                           ["dev", "test", "train"])
    assert (info.language, info.emotion, info.event, info.itn) == ("zh", "HAPPY", "Speech", "withitn")
    assert any("train: 5 utterances, 2 speakers" in r.getMessage() for r in caplog.records)


def test_kaldi_sets_in_place_and_valid_name(tmp_path: Path) -> None:
    data = tmp_path / "data"
    write_dir(data / "train", BROKEN_TRAIN)
    write_dir(data / "valid", {k: v for k, v in BROKEN_TRAIN.items() if k != "spk2utt"})
    info = prepare_kaldi(data, data)  # the user's data/ already is the data dir
    for name, raw in BROKEN_TRAIN.items():
        assert (data / "train" / name).read_bytes() == raw
    assert (data / "valid" / "spk2utt").read_bytes() == BROKEN_TRAIN["spk2utt"]
    assert (info.valid_set, info.test_sets) == ("valid", ["valid"])


def lines(path: Path) -> list[bytes]:
    """Raw lines of a file, each without its newline."""
    return path.read_bytes().split(b"\n")[:-1] if path.read_bytes().endswith(b"\n") else \
        path.read_bytes().split(b"\n")


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
    train, dev = tmp_path / "data" / "train", tmp_path / "data" / "dev"
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
    assert speakers(tmp_path / "data2" / "dev") == {"spk04"}


def test_kaldi_train_without_dev_is_split(tmp_path: Path) -> None:
    corpus = tmp_path / "mine"
    write_dir(corpus / "train", BROKEN_TRAIN)
    write_dir(corpus / "eval", {"wav.scp": b"x /abs/x.wav\n"})
    info = prepare_kaldi(corpus, tmp_path / "data")
    assert (info.valid_set, info.test_sets) == ("dev", ["dev", "eval"])
    assert speakers(tmp_path / "data" / "dev") == {"spkB"}


def test_pick_dev_speakers_is_deterministic() -> None:
    spks = [f"s{i:03d}".encode() for i in range(100)]
    assert pick_dev_speakers(spks[::-1], None) == pick_dev_speakers(spks, 5)
    assert len(pick_dev_speakers(spks, 5)) == 5 and len(pick_dev_speakers(spks, 99)) == 99


def test_kaldi_errors(tmp_path: Path) -> None:
    with pytest.raises(CorpusLayoutError, match="wav.scp"):
        prepare_kaldi(tmp_path, tmp_path / "data")  # empty directory
    with pytest.raises(CorpusLayoutError, match="expected a directory"):
        prepare_kaldi(tmp_path / "missing", tmp_path / "data")
    write_dir(tmp_path / "sets" / "dev", BROKEN_TRAIN)
    with pytest.raises(CorpusLayoutError, match=str(tmp_path / "sets" / "train" / "wav.scp")):
        prepare_kaldi(tmp_path / "sets", tmp_path / "data")
    one = write_dir(tmp_path / "one", {"wav.scp": b"a-1 /x.wav\n", "utt2spk": b"a-1 a\n"})
    with pytest.raises(CorpusLayoutError, match="cannot hold out 1 of 1 speakers"):
        prepare_kaldi(one, tmp_path / "data")
    (one / "utt2spk").unlink()
    with pytest.raises(CorpusLayoutError, match="utt2spk"):
        prepare_kaldi(one, tmp_path / "data")
    seg = write_dir(tmp_path / "seg" / "train", {**BROKEN_TRAIN, "segments": b"spkA-u1 rec1 0 1\n"})
    write_dir(tmp_path / "seg" / "dev", BROKEN_TRAIN)
    with pytest.raises(CorpusLayoutError, match=str(seg / "segments")):
        prepare_kaldi(tmp_path / "seg", tmp_path / "data")
    data = tmp_path / "inplace"
    write_dir(data / "train", BROKEN_TRAIN)
    with pytest.raises(CorpusLayoutError, match="would overwrite"):
        prepare_kaldi(data, data)
    assert (data / "train" / "wav.scp").read_bytes() == BROKEN_TRAIN["wav.scp"]


# ---------------------------------------------------------------------------------------- speechocean762


@pytest.mark.shared_data
def test_speechocean762_shared(tmp_path: Path) -> None:
    corpus = SHARED / "speechocean762"
    if not corpus.is_dir():
        pytest.skip(f"{corpus} is not there (real data shared beside the repo)")
    info = prepare_speechocean(corpus, tmp_path / "data")
    train = check_set(tmp_path / "data" / "train", 600, speaker_prefix=False)
    dev = check_set(tmp_path / "data" / "dev", 200, speaker_prefix=False)
    assert len(set(train.values())) == 30 and len(set(dev.values())) == 10
    assert set(train.values()).isdisjoint(dev.values())
    assert table(tmp_path / "data" / "train" / "text")["000750005"] == "BORN LIKES GREEN"
    assert table(tmp_path / "data" / "train" / "wav.scp")["000750005"] == str(
        corpus.resolve() / "WAVE" / "SPEAKER0075" / "000750005.WAV")
    assert (info.train_set, info.valid_set, info.test_sets, info.language) == ("train", "dev", ["dev"], "en")


def test_speechocean762_tree(tmp_path: Path, wavs: list[Path]) -> None:
    corpus = tmp_path / "speechocean762"
    parts = {"train": ("0075", "0131"), "dev": ("0048",)}
    for part, spks in parts.items():
        rows = [(f"0{spk}{j:04d}", spk) for spk in spks for j in (5, 15)]
        for i, (key, spk) in enumerate(rows):
            copy_wav(wavs[i], corpus / "WAVE" / f"SPEAKER{spk}" / f"{key}.WAV")
        write_dir(corpus / part, {
            "wav.scp": "".join(f"{k}\tWAVE/SPEAKER{s}/{k}.WAV\n" for k, s in rows).encode(),
            "text": "".join(f"{k}\tIT'S NOT FISH\n" for k, _ in rows).encode(),
            "utt2spk": "".join(f"{k} {s}\n" for k, s in rows).encode(),
            "spk2gender": "".join(f"{s}\tf\n" for s in spks).encode()})
    info = prepare_speechocean(corpus, tmp_path / "data")
    train = check_set(tmp_path / "data" / "train", 4, speaker_prefix=False)
    check_set(tmp_path / "data" / "dev", 2, speaker_prefix=False)
    assert set(train.values()) == {"0075", "0131"}
    assert table(tmp_path / "data" / "dev" / "text") == {"000480005": "IT'S NOT FISH",
                                                          "000480015": "IT'S NOT FISH"}
    assert info.sets == ["dev", "train"]
    with pytest.raises(CorpusLayoutError, match=str(corpus / "test")):
        prepare_speechocean(corpus, tmp_path / "data", parts=["train", "test"])
    with pytest.raises(CorpusLayoutError, match=str(tmp_path / "WAVE")):
        prepare_speechocean(tmp_path, tmp_path / "data")


# ------------------------------------------------------------------------------------ mandarin_syllables


@pytest.mark.shared_data
def test_mandarin_syllables_shared(tmp_path: Path) -> None:
    corpus = SHARED / "mandarin_syllables"
    if not corpus.is_dir():
        pytest.skip(f"{corpus} is not there (real data shared beside the repo)")
    info = prepare_mandarin(corpus, tmp_path / "data")
    check_set(tmp_path / "data" / "train", 1707)
    check_set(tmp_path / "data" / "dev", 1187)
    assert speakers(tmp_path / "data" / "dev") == {"gcin_liu"}
    assert table(tmp_path / "data" / "dev" / "text")["gcin_liu-ê4"] == "ê4"
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
    check_set(tmp_path / "data" / "train", 2)
    dev = check_set(tmp_path / "data" / "dev", 2)
    assert set(dev.values()) == {"gcin_liu"}
    assert table(tmp_path / "data" / "dev" / "text") == {"gcin_liu-de5": "de5", "gcin_liu-ê4": "ê4"}
    assert table(tmp_path / "data" / "dev" / "wav.scp")["gcin_liu-ê4"] == str(
        corpus.resolve() / "wav" / "gcin_liu" / "gcin_liu-ê4.flac")
    prepare_mandarin(corpus, tmp_path / "data2", dev_speakers=["cmn_chenwang"])
    assert speakers(tmp_path / "data2" / "dev") == {"cmn_chenwang"}
    with pytest.raises(CorpusLayoutError, match=str(tmp_path / "data" / "all")):
        prepare_mandarin(tmp_path, tmp_path / "out")


# ------------------------------------------------------------------------------------------------ aishell1


def make_aishell(root: Path, wavs: list[Path]) -> Path:
    """An AISHELL-1 tree: 2 train speakers, 1 dev, 1 test, 2 utterances each; one wav has no transcript."""
    layout = {"train": ("S0002", "S0003"), "dev": ("S0724",), "test": ("S0764",)}
    lines, i = [], 0
    for part, spks in layout.items():
        for spk in spks:
            for w in (122, 123):
                utt = f"BAC009{spk}W{w:04d}"
                copy_wav(wavs[i], root / "data_aishell" / "wav" / part / spk / f"{utt}.wav")
                lines.append(f"{utt} 而 对 楼市 成交 抑制 作用 最 大 的 限 购\n")
                i += 1
    copy_wav(wavs[i], root / "data_aishell" / "wav" / "train" / "S0003" / "BAC009S0003W0999.wav")
    lines.append("BAC009S0916W0100 这 条 没有 音频\n")
    transcript = root / "data_aishell" / "transcript" / "aishell_transcript_v0.8.txt"
    transcript.parent.mkdir(parents=True)
    transcript.write_text("".join(lines), encoding="utf-8")
    return root


def test_aishell1_tree(tmp_path: Path, wavs: list[Path], caplog: pytest.LogCaptureFixture) -> None:
    corpus = make_aishell(tmp_path / "aishell", wavs)
    caplog.set_level(logging.INFO)
    info = prepare_aishell1(corpus, tmp_path / "data")
    train = check_set(tmp_path / "data" / "train", 4, speaker_prefix=False)
    check_set(tmp_path / "data" / "dev", 2, speaker_prefix=False)
    check_set(tmp_path / "data" / "test", 2, speaker_prefix=False)
    assert train["BAC009S0002W0122"] == "S0002" and set(train.values()) == {"S0002", "S0003"}
    assert table(tmp_path / "data" / "dev" / "text")["BAC009S0724W0123"] == "而对楼市成交抑制作用最大的限购"
    warning = next(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert "1 wavs have no line" in warning and "BAC009S0003W0999" in warning
    assert (info.valid_set, info.test_sets, info.language) == ("dev", ["dev", "test"], "zh")
    assert info.corpus_dir == str((corpus / "data_aishell").resolve())
    prepare_aishell1(corpus / "data_aishell", tmp_path / "data2")  # data_aishell/ itself
    for name in ("wav.scp", "text"):
        assert (tmp_path / "data2/test" / name).read_bytes() == (tmp_path / "data/test" / name).read_bytes()


def test_aishell1_errors(tmp_path: Path, wavs: list[Path]) -> None:
    with pytest.raises(CorpusLayoutError, match="aishell_transcript_v0.8.txt"):
        prepare_aishell1(tmp_path, tmp_path / "data")
    corpus = make_aishell(tmp_path / "aishell", wavs)
    shutil.rmtree(corpus / "data_aishell" / "wav" / "test")
    (corpus / "data_aishell" / "wav" / "test").mkdir()
    (corpus / "data_aishell" / "wav" / "S0764.tar.gz").write_bytes(b"")
    with pytest.raises(CorpusLayoutError, match="extract the speaker archives first"):
        prepare_aishell1(corpus, tmp_path / "data")


# --------------------------------------------------------------------------------------------- librispeech


def make_librispeech(root: Path, wavs: list[Path]) -> Path:
    """A LibriSpeech tree of 3 parts; one flac has no transcript line, one line has no flac."""
    layout = {"train-clean-100": [("103", "1240"), ("103", "1241"), ("1034", "121119")],
              "dev-clean": [("1272", "128104")], "test-clean": [("1089", "134686")]}
    i = 0
    for part, chapters in layout.items():
        for spk, chapter in chapters:
            d = root / "LibriSpeech" / part / spk / chapter
            keys = [f"{spk}-{chapter}-{u:04d}" for u in range(2)]
            for key in keys:
                write_flac(wavs[i], d / f"{key}.flac")
                i += 1
            trans = "".join(f"{k} CHAPTER ONE MISSUS RACHEL\n" for k in keys)
            (d / f"{spk}-{chapter}.trans.txt").write_text(trans)
    write_flac(wavs[i], root / "LibriSpeech" / "dev-clean" / "1272" / "128104" / "1272-128104-0009.flac")
    with open(root / "LibriSpeech" / "test-clean" / "1089" / "134686" / "1089-134686.trans.txt", "a") as f:
        f.write("1089-134686-0007 NO AUDIO FOR THIS ONE\n")
    return root


def test_librispeech_tree(tmp_path: Path, wavs: list[Path], caplog: pytest.LogCaptureFixture) -> None:
    corpus = make_librispeech(tmp_path / "ls", wavs)
    caplog.set_level(logging.INFO)
    info = prepare_librispeech(corpus, tmp_path / "data")
    train = check_set(tmp_path / "data" / "train", 6)
    check_set(tmp_path / "data" / "dev", 2)
    check_set(tmp_path / "data" / "dev_clean", 2)
    check_set(tmp_path / "data" / "test_clean", 2)
    assert not (tmp_path / "data" / "test_other").exists()
    assert set(train.values()) == {"103-1240", "103-1241", "1034-121119"}
    assert table(tmp_path / "data" / "train" / "text")["103-1240-0000"] == "CHAPTER ONE MISSUS RACHEL"
    assert (info.train_set, info.valid_set, info.test_sets) == ("train", "dev", ["dev_clean", "test_clean"])
    assert info.sets == ["dev", "dev_clean", "test_clean", "train"]
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("1 flac files have no transcript" in m and "1272-128104-0009" in m for m in messages)
    assert any("1 transcript lines have no flac" in m and "1089-134686-0007" in m for m in messages)
    info = prepare_librispeech(corpus / "LibriSpeech", tmp_path / "data2",
                               parts=["train-clean-100", "dev-clean"])
    assert info.test_sets == ["dev_clean"]


def test_librispeech_errors(tmp_path: Path, wavs: list[Path]) -> None:
    with pytest.raises(CorpusLayoutError, match=str(tmp_path / "LibriSpeech" / "train-clean")):
        prepare_librispeech(tmp_path, tmp_path / "data")
    corpus = make_librispeech(tmp_path / "ls", wavs)
    with pytest.raises(CorpusLayoutError, match="no dev-"):
        prepare_librispeech(corpus, tmp_path / "data", parts=["train-clean-100", "test-clean"])
    with pytest.raises(CorpusLayoutError, match="unknown LibriSpeech parts"):
        prepare_librispeech(corpus, tmp_path / "data", parts=["train-clean-100", "clean"])
