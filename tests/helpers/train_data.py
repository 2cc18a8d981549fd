"""Small Kaldi corpora from the bundled digit recordings, for the training tests.

Reads corpora/free-spoken-digit-dataset/recordings; writes <root>/{train,dev}/{wav.scp,text,utt2spk}.
"""

from __future__ import annotations

from pathlib import Path

from tests.helpers.make_bad_kaldi_dir import DEFAULT_WAV_DIR

WORDS = ("ZERO", "ONE", "TWO", "THREE", "FOUR", "FIVE", "SIX", "SEVEN", "EIGHT", "NINE")
TRAIN_SPEAKERS = ("george", "jackson", "lucas", "nicolas")
DEV_SPEAKER = "theo"


def make_digit_subset(root: Path, per_digit_train: int = 10, per_digit_dev: int = 5) -> Path:
    """Kaldi dirs train (4 speakers) and dev (the held-out speaker) with the first takes of each digit."""
    for name, speakers, takes in (("train", TRAIN_SPEAKERS, per_digit_train), ("dev", (DEV_SPEAKER,),
                                                                               per_digit_dev)):
        rows = sorted((f"{spk}-{d}_{spk}_{i}", DEFAULT_WAV_DIR / f"{d}_{spk}_{i}.wav", WORDS[d], spk)
                      for spk in speakers for d in range(10) for i in range(takes))
        out = root / name
        out.mkdir(parents=True)
        (out / "wav.scp").write_text("".join(f"{k} {w}\n" for k, w, _, _ in rows))
        (out / "text").write_text("".join(f"{k} {t}\n" for k, _, t, _ in rows))
        (out / "utt2spk").write_text("".join(f"{k} {s}\n" for k, _, _, s in rows))
    return root
