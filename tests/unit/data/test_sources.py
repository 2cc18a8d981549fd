"""What stage 0 read (funasr_recipe/data/sources.py): a corpus edited after stage 0 redoes it, and the log
says which files changed."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from funasr_recipe.data.corpus import CorpusInfo, write_corpus_info
from funasr_recipe.data.sources import LISTING, compare, write_listing
from tests.helpers.make_bad_kaldi_dir import DEFAULT_WAV_DIR
from tests.helpers.run_sh import run_sh

WAVS = sorted(DEFAULT_WAV_DIR.glob("*_theo_*.wav"))[:4]


def small_corpus(root: Path) -> Path:
    """Kaldi dirs root/corpus/{train,dev} whose recordings live outside them (root/audio), as they often do;
    returns root/corpus/train."""
    audio = root / "audio"
    audio.mkdir(parents=True)
    for name, wavs in (("train", WAVS[:2]), ("dev", WAVS[2:])):
        rows = []
        for wav in wavs:
            shutil.copy(wav, audio / wav.name)
            digit, spk, take = wav.stem.split("_")
            rows.append((f"{spk}-{wav.stem}", audio / wav.name, f"DIGIT {digit}", spk))
        corpus = root / "corpus" / name
        corpus.mkdir(parents=True)
        (corpus / "wav.scp").write_text("".join(f"{k} {w}\n" for k, w, _, _ in rows))
        (corpus / "text").write_text("".join(f"{k} {t}\n" for k, _, t, _ in rows))
        (corpus / "utt2spk").write_text("".join(f"{k} {s}\n" for k, _, _, s in rows))
    return root / "corpus" / "train"


def prepared_data_dir(root: Path) -> Path:
    corpus = small_corpus(root)
    data = root / "data"
    (data / "all").mkdir(parents=True)
    shutil.copy(corpus / "wav.scp", data / "all" / "wav.scp")
    write_corpus_info(data, CorpusInfo("kaldi", str(corpus.parent), "all", "all", ["all"], "en"))
    return data


def test_an_unchanged_corpus_compares_equal_and_each_kind_of_change_is_named(tmp_path: Path) -> None:
    data = prepared_data_dir(tmp_path)
    assert compare(data) == [f"no listing of the corpus files from an earlier run ({data / LISTING})"]
    write_listing(data)
    assert compare(data) == []
    text = tmp_path / "corpus" / "train" / "text"
    text.write_text(text.read_text().replace("DIGIT", "NUMBER", 1))
    wav = tmp_path / "audio" / WAVS[0].name  # outside the corpus dir: listed through wav.scp
    wav.write_bytes(wav.read_bytes() + b"\0\0")
    (tmp_path / "corpus" / "train" / "utt2lang").write_text("")
    os.remove(tmp_path / "corpus" / "dev" / "utt2spk")
    changes = compare(data)
    assert len(changes) == 3, changes
    assert changes[0].startswith("2 modified: ")
    assert f"{wav} (size" in changes[0] and f"{text} (size" in changes[0]
    assert changes[1] == f"1 added: {tmp_path / 'corpus' / 'train' / 'utt2lang'}"
    assert changes[2] == f"1 removed: {tmp_path / 'corpus' / 'dev' / 'utt2spk'}"


@pytest.mark.slow  # three stage-0 runs of run.sh
def test_a_transcript_edited_after_stage_0_is_read_again(tmp_path: Path) -> None:
    corpus = small_corpus(tmp_path)
    args = ("--stage", "0", "--stop-stage", "0", "--corpus", "kaldi", "--corpus-dir", str(corpus.parent),
            "--data-dir", str(tmp_path / "data"), "--exp-dir", str(tmp_path / "exp"), "--nj", "1")
    first = run_sh(*args)
    assert first.returncode == 0, first.stderr[-3000:]
    again = run_sh(*args)
    assert again.returncode == 0 and "is done; skipping" in again.stderr
    key = next(iter((corpus / "text").read_text().split()))
    (corpus / "text").write_text((corpus / "text").read_text().replace(f"{key} DIGIT", f"{key} NUMBER"))
    edited = run_sh(*args)
    assert edited.returncode == 0, edited.stderr[-3000:]
    assert "is done; skipping" not in edited.stderr
    assert f"since stage 0 last ran: 1 modified: {corpus / 'text'}" in edited.stderr
    lines = [json.loads(line) for line in open(tmp_path / "data" / "train" / "data.jsonl")]
    texts = {obj["key"]: obj["target"] for obj in lines}
    assert texts[key].startswith("NUMBER"), texts
