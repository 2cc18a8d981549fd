"""The same utterances written in each input format stage 0 takes: Kaldi dirs (whole files), Kaldi dirs
with segments (the utterances joined into one recording per speaker), FunASR's JSONL, a Hugging Face
audiofolder and lhotse manifests (ranges of the joined recordings, written with lhotse's own API).

Reads real audio (the utterances' files); writes each format under the directory given.

  utts = speechocean_utts(Path("../shared/data/speechocean762"), per_set=60)
  write_kaldi(utts, tmp / "kaldi"); write_jsonl(utts, tmp / "jsonl")
"""

from __future__ import annotations

import csv
import gzip
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf


@dataclass(frozen=True)
class FormatUtt:
    """One utterance of a set: its key, audio file, transcript and speaker."""

    split: str  # train or dev
    key: str
    wav: Path
    text: str
    speaker: str


def speechocean_utts(corpus: Path, per_set: int) -> list[FormatUtt]:
    """The first ``per_set`` utterances (in wav.scp order) of speechocean762's train and dev parts."""
    utts = []
    for split in ("train", "dev"):
        table = {name: dict(line.split(None, 1) for line in (corpus / split / name).read_text().splitlines()
                            if line.strip())
                 for name in ("wav.scp", "text", "utt2spk")}
        for key in list(table["wav.scp"])[:per_set]:
            utts.append(FormatUtt(split, key, corpus / table["wav.scp"][key].strip(),
                                  table["text"][key].strip(), table["utt2spk"][key].strip()))
    return utts


def _by(utts: list[FormatUtt], split: str) -> list[FormatUtt]:
    return [u for u in utts if u.split == split]


def write_kaldi(utts: list[FormatUtt], root: Path) -> Path:
    """root/{train,dev}/{wav.scp,text,utt2spk}: one file per utterance."""
    for split in ("train", "dev"):
        d = root / split
        d.mkdir(parents=True)
        rows = _by(utts, split)
        (d / "wav.scp").write_text("".join(f"{u.key} {u.wav}\n" for u in rows))
        (d / "text").write_text("".join(f"{u.key} {u.text}\n" for u in rows))
        (d / "utt2spk").write_text("".join(f"{u.key} {u.speaker}\n" for u in rows))
    return root


def join_recordings(utts: list[FormatUtt], out: Path) -> dict[str, tuple[str, Path, float, float]]:
    """Join each speaker's utterances of a split, in order, into out/<split>_<speaker>.flac with 0.25 s
    of silence between them; {key: (recording id, file, start s, end s)}."""
    out.mkdir(parents=True, exist_ok=True)
    where = {}
    groups: dict[tuple[str, str], list[FormatUtt]] = {}
    for u in utts:
        groups.setdefault((u.split, u.speaker), []).append(u)
    for (split, speaker), group in groups.items():
        rec_id, path = f"{split}_{speaker}", out / f"{split}_{speaker}.flac"
        pieces, offset, rate = [], 0, None
        for u in group:
            audio, rate = sf.read(u.wav, dtype="int16")
            gap = np.zeros(rate // 4, dtype=np.int16)
            where[u.key] = (rec_id, path, offset / rate, (offset + len(audio)) / rate)
            pieces += [audio, gap]
            offset += len(audio) + len(gap)
        sf.write(path, np.concatenate(pieces), rate)
    return where


def write_kaldi_segments(utts: list[FormatUtt], root: Path) -> Path:
    """root/{train,dev}/{wav.scp (recordings), segments, text, utt2spk}."""
    where = join_recordings(utts, root / "audio")
    write_kaldi(utts, root)
    for split in ("train", "dev"):
        rows = _by(utts, split)
        recs = sorted({(where[u.key][0], where[u.key][1]) for u in rows})
        (root / split / "wav.scp").write_text("".join(f"{r} {p}\n" for r, p in recs))
        (root / split / "segments").write_text("".join(
            f"{u.key} {where[u.key][0]} {where[u.key][2]:.6f} {where[u.key][3]:.6f}\n" for u in rows))
    return root


def write_jsonl(utts: list[FormatUtt], root: Path) -> Path:
    """root/train.jsonl and root/val.jsonl.gz in FunASR's SenseVoice fine-tuning format."""
    root.mkdir(parents=True)
    for split, name, opener in (("train", "train.jsonl", open), ("dev", "val.jsonl.gz", gzip.open)):
        with opener(root / name, "wt", encoding="utf-8") as f:
            for u in _by(utts, split):
                f.write(json.dumps({"key": u.key, "source": str(u.wav), "source_len": 0, "target": u.text,
                                    "target_len": len(u.text.split()), "text_language": "<|en|>",
                                    "emo_target": "<|NEUTRAL|>", "event_target": "<|Speech|>",
                                    "with_or_wo_itn": "<|woitn|>", "speaker": u.speaker}) + "\n")
    return root


def write_audiofolder(utts: list[FormatUtt], root: Path) -> Path:
    """root/{train,dev}/metadata.csv (file_name, transcription, speaker_id) beside links to the audio."""
    for split in ("train", "dev"):
        d = root / split
        (d / "audio").mkdir(parents=True)
        with open(d / "metadata.csv", "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(["file_name", "transcription", "speaker_id"])
            for u in _by(utts, split):
                (d / "audio" / f"{u.key}{u.wav.suffix}").symlink_to(u.wav)
                w.writerow([f"audio/{u.key}{u.wav.suffix}", u.text, u.speaker])
    return root


def write_lhotse(utts: list[FormatUtt], root: Path) -> Path:
    """root/demo_recordings_train.jsonl.gz + demo_supervisions_train.jsonl.gz (ranges of the joined
    recordings) and root/demo_cuts_dev.jsonl.gz, written with lhotse."""
    from lhotse import CutSet, Recording, RecordingSet, SupervisionSegment, SupervisionSet

    where = join_recordings(utts, root / "audio")
    for split in ("train", "dev"):
        rows = _by(utts, split)
        recordings = {where[u.key][0]: Recording.from_file(where[u.key][1], recording_id=where[u.key][0])
                      for u in rows}
        sups = [SupervisionSegment(id=u.key, recording_id=where[u.key][0], start=where[u.key][2],
                                   duration=where[u.key][3] - where[u.key][2], channel=0, text=u.text,
                                   speaker=u.speaker, language="English") for u in rows]
        rec_set = RecordingSet.from_recordings(recordings.values())
        sup_set = SupervisionSet.from_segments(sups)
        if split == "train":
            rec_set.to_file(root / "demo_recordings_train.jsonl.gz")
            sup_set.to_file(root / "demo_supervisions_train.jsonl.gz")
        else:
            CutSet.from_manifests(recordings=rec_set, supervisions=sup_set).trim_to_supervisions(
                keep_overlapping=False).to_file(root / "demo_cuts_dev.jsonl.gz")
    return root


WRITERS = {"kaldi": write_kaldi, "kaldi_segments": write_kaldi_segments, "jsonl": write_jsonl,
           "audiofolder": write_audiofolder, "lhotse": write_lhotse}
