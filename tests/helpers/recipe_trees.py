"""Helpers of tests/unit/recipes/test_recipes.py: corpus trees built from real recordings, checks of written
sets.

Reads real wavs (the bundled digit corpus); writes only under the paths the tests give (tmp_path).
"""

from __future__ import annotations

import re
import shutil
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
import soundfile as sf

from recipes.common import CorpusLayoutError


def table(path: Path) -> dict[str, str]:
    """A UTF-8 Kaldi table as {key: value}."""
    rows = [line.rstrip("\n").split(" ", 1) for line in path.read_text(encoding="utf-8").splitlines()]
    return {r[0]: r[1] if len(r) > 1 else "" for r in rows}


def check_set(set_dir: Path, n_utts: int, speaker_prefix: bool = True) -> dict[str, str]:
    """Assert the invariants of a written set; returns its utt2spk."""
    keys = [line.split(" ", 1)[0] for line in (set_dir / "wav.scp").read_text(encoding="utf-8").splitlines()]
    assert len(keys) == n_utts and keys == sorted(set(keys))
    wav, text, utt2spk = table(set_dir / "wav.scp"), table(set_dir / "text"), table(set_dir / "utt2spk")
    assert list(text) == keys and list(utt2spk) == keys
    assert all(Path(path).is_absolute() and Path(path).is_file() for path in wav.values())
    spk2utt = {spk: utts.split() for spk, utts in table(set_dir / "spk2utt").items()}
    assert list(spk2utt) == sorted(spk2utt)
    assert {u: s for s, us in spk2utt.items() for u in us} == utt2spk
    if speaker_prefix:
        assert all(key.startswith(f"{spk}-") for key, spk in utt2spk.items())
    else:  # Kaldi's real rule: sorting by key keeps each speaker's utterances together
        order = list(utt2spk.values())
        runs = [spk for i, spk in enumerate(order) if i == 0 or spk != order[i - 1]]
        assert len(runs) == len(set(runs)), runs
    return utt2spk


def raises(text: object) -> AbstractContextManager:
    """Expect a CorpusLayoutError whose message holds ``text`` (a path or words)."""
    return pytest.raises(CorpusLayoutError, match=re.escape(str(text)))


def speakers(set_dir: Path) -> set[str]:
    """The speakers of a written set."""
    rows = (set_dir / "utt2spk").read_bytes().splitlines()
    return {row.split()[1].decode() for row in rows if row.strip()}


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


def write_dir(path: Path, files: dict[str, bytes]) -> Path:
    """A data dir with the given raw files."""
    path.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (path / name).write_bytes(data)
    return path


def lines(path: Path) -> list[bytes]:
    """Raw lines of a file, each without its newline."""
    return path.read_bytes().removesuffix(b"\n").split(b"\n")


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
