"""A Kaldi corpus with one utterance of each kind of bad input the reliability issue found, among real
digit recordings: the fault suite runs stages 0-2 on it and checks each was caught and named.

Reads corpora/free-spoken-digit-dataset/recordings; writes <root>/{train,dev}/{wav.scp,text,utt2spk} and
<root>/audio/*.wav. ``HOSTILE`` names the keys.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

from tests.helpers.make_bad_kaldi_dir import DEFAULT_WAV_DIR
from tests.helpers.train_data import WORDS

HOSTILE = {
    "clash": "sp0.9-george-0_george_0",       # what stage 1 calls george-0_george_0's 0.9 copy
    "rate11025": "george-r11025", "rate16001": "george-r16001", "rate44101": "george-r44101",
    "one_sample": "george-one",
    "ctc": "george-ctc",                      # 100 words on 0.5 s
    "long": "george-long",                    # 25 s: over the tiny config's max_token_length (20 s)
    "line_sep": "jackson-ls\u2028x",          # U+2028 in a key
    "locked": "lucas-locked",                 # a wav this user may not read
    "hung": "lucas-hung",                     # a pipe that never ends
    "dev_same_audio": "theo-same_audio",      # dev, the same wav as a training utterance
    "dev_same_key": "george-1_george_1",      # dev, a training utterance's key
}


def _row(key: str, audio: str, words: str, spk: str) -> tuple[str, str, str, str]:
    return key, audio, words, spk


def build(root: Path, lock: bool) -> dict[str, list[tuple[str, str, str, str]]]:
    """Write the corpus; ``lock``: make HOSTILE["locked"] unreadable (chmod 000). Returns its rows."""
    audio = root / "audio"
    audio.mkdir(parents=True)

    def save(name: str, wave: np.ndarray, rate: int) -> str:
        sf.write(audio / name, wave, rate, subtype="PCM_16")
        return str(audio / name)

    def digit(d: int, spk: str, take: int) -> tuple[np.ndarray, int]:
        return sf.read(DEFAULT_WAV_DIR / f"{d}_{spk}_{take}.wav", dtype="float32")

    train = [_row(f"{spk}-{d}_{spk}_{t}", str(DEFAULT_WAV_DIR / f"{d}_{spk}_{t}.wav"), WORDS[d], spk)
             for spk in ("george", "jackson", "lucas") for d in range(10) for t in range(2)]
    wave, rate = digit(2, "george", 1)
    for target in (11025, 16001, 44101):
        odd = save(f"r{target}.wav", soxr.resample(wave, rate, target), target)
        train.append(_row(f"george-r{target}", odd, WORDS[2], "george"))
    train.append(_row(HOSTILE["clash"], str(DEFAULT_WAV_DIR / "1_george_0.wav"), WORDS[1], "george"))
    train.append(_row(HOSTILE["one_sample"], save("one.wav", wave[:1], rate), WORDS[2], "george"))
    short = np.zeros(rate // 2, dtype=np.float32)
    short[: min(len(wave), len(short))] = wave[: len(short)]
    hundred = " ".join(WORDS[i % 10] for i in range(100))
    train.append(_row(HOSTILE["ctc"], save("ctc.wav", short, rate), hundred, "george"))
    parts, words = [], []
    while sum(len(p) for p in parts) < 25 * rate:
        d = len(parts) % 10
        parts.append(digit(d, "george", 2)[0])
        words.append(WORDS[d])
    long_wav = save("long.wav", np.concatenate(parts), rate)
    train.append(_row(HOSTILE["long"], long_wav, " ".join(words), "george"))
    train.append(_row(HOSTILE["line_sep"], str(DEFAULT_WAV_DIR / "3_jackson_2.wav"), WORDS[3], "jackson"))
    locked = save("locked.wav", digit(4, "lucas", 2)[0], rate)
    if lock:
        Path(locked).chmod(0)
    train.append(_row(HOSTILE["locked"], locked, WORDS[4], "lucas"))
    train.append(_row(HOSTILE["hung"], "sh -c 'sleep 600' |", WORDS[5], "lucas"))
    dev = [_row(f"theo-{d}_theo_0", str(DEFAULT_WAV_DIR / f"{d}_theo_0.wav"), WORDS[d], "theo")
           for d in range(10)]
    dev.append(_row(HOSTILE["dev_same_audio"], train[0][1], train[0][2], "theo"))
    dev.append(_row(HOSTILE["dev_same_key"], str(DEFAULT_WAV_DIR / "7_theo_1.wav"), WORDS[7], "george"))
    # train: a UTF-8 byte-order mark (Windows editors) on its tables; dev: CR-only (old Mac) and CRLF ends.
    _write(root / "train", sorted(train), bom=True, ends={"wav.scp": "\n", "text": "\n", "utt2spk": "\n"})
    _write(root / "dev", sorted(dev), bom=False, ends={"wav.scp": "\n", "text": "\r\n", "utt2spk": "\r"})
    return {"train": train, "dev": dev}


def _write(set_dir: Path, rows: list[tuple[str, str, str, str]], bom: bool, ends: dict[str, str]) -> None:
    set_dir.mkdir(parents=True)
    for name, column in (("wav.scp", 1), ("text", 2), ("utt2spk", 3)):
        body = "".join(f"{r[0]} {r[column]}{ends[name]}" for r in rows)
        (set_dir / name).write_bytes((b"\xef\xbb\xbf" if bom else b"") + body.encode("utf-8"))
