"""Stage 0's validation: check every utterance of a Kaldi data dir and write funasr's JSONL.

Reads  <set-dir>/{wav.scp,text[,segments,utt2spk,utt2lang,utt2emo,utt2event,utt2itn]} (any order, any
       size; with segments, wav.scp lists recordings and each segment is an utterance: data/segments.py);
writes <set-dir>/data.jsonl (accepted, sorted by key, SenseVoice schema), <set-dir>/rejected.tsv
(file, line, key, reason, detail of every rejected entry) and <set-dir>/report.json (counts).

Nothing is dropped silently: every distinct key of wav.scp or text, and every line without a
readable key, is one entry, and entries = accepted + rejected. ``--strict true`` stops at the first
bad entry instead. Files are merged by key from disk-sorted streams and audio headers are probed
by --nj processes in bounded batches, so memory stays flat as the corpus grows. Beyond each line's
own checks, a key ``sp<factor>-X`` is rejected where X is a key too (stage 1's name for X's
speed-perturbed copies), and audio shorter than MIN_DURATION_S (which gives no fbank frame).

  report = validate_set(Path("data/train"), language="en", nj=2)
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import logging
import multiprocessing as mp
import os
import re
import stat
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from funasr_recipe.core.log import Progress
from funasr_recipe.core.rejections import REJECTED_HEADER, BadInputError, Rejection
from funasr_recipe.data.kaldi_table import (
    Record,
    TableError,
    count_lines,
    first_field,
    iter_lines,
    open_table,
    sort_records,
    sorted_records,
)
from funasr_recipe.data.manifest import manifest_line
from funasr_recipe.data.segments import SEGMENT_ERRORS, resolve_segments
from funasr_recipe.data.tags import canonical_tag, valid_names
from funasr_recipe.features.audio import AudioError, AudioInfo, is_pipe, probe_audio

log = logging.getLogger(__name__)

TABLES = ("wav.scp", "segments", "text", "utt2spk", "utt2lang", "utt2emo", "utt2event", "utt2itn")
TAG_TABLES = {"utt2lang": ("language", "unknown_language"), "utt2emo": ("emotion", "unknown_emotion"),
              "utt2event": ("event", "unknown_event"), "utt2itn": ("itn", "unknown_itn")}
BATCH = 2048  # entries probed per pool round: bounds memory, keeps both cores busy
TARGET_RATE = 16000  # what the models' frontends expect; others are counted as "resampled"
# One 10 ms fbank frame (the frame shift). Anything shorter cannot give a frame once resampled, and a
# one-sample clip crashes torchaudio's fbank in stage 1. 10 to 25 ms is fine: the frontend shortens its
# 25 ms window to the clip.
MIN_DURATION_S = 0.01
# Stage 1 names the speed-perturbed copies of X ``sp<factor:g>-X`` (features/dump.py: speed_key).
DERIVED_KEY = re.compile(rb"sp\d+(?:\.\d+)?-(.+)")


@dataclass
class Entry:
    """All lines of one key across the tables of a data dir."""

    key: str
    lines: dict[str, list[Record]] = field(default_factory=dict)

    def one(self, table: str) -> Record | None:
        recs = self.lines.get(table)
        return recs[0] if recs else None


def _tagged(recs: Iterator[Record], idx: int, table: str) -> Iterator[tuple]:
    for rec in recs:
        yield rec.key, idx, rec.lineno, table, rec


def audio_table(set_dir: Path) -> str:
    """The table keyed by utterance that says where its audio is: segments where there is one."""
    return "segments" if (set_dir / "segments").exists() else "wav.scp"


def merged_entries(set_dir: Path, tmp_dir: Path, blank: dict[str, list[int]]) -> Iterator[Entry]:
    """Merge the key-sorted streams of every table present into one Entry per key (with segments, the
    resolved segments stand for wav.scp, which is keyed by recording)."""
    streams = []
    segmented = audio_table(set_dir) == "segments"
    for idx, table in enumerate(TABLES):
        path = set_dir / table
        if not path.exists() or (segmented and table == "wav.scp"):
            continue
        blank[table] = []
        records = (sorted_records(path, tmp_dir, blank[table]) if table != "segments"
                   else sort_records(resolve_segments(set_dir, blank[table]), table, tmp_dir))
        streams.append(_tagged(records, idx, table))
    for key, group in itertools.groupby(heapq.merge(*streams), key=lambda t: t[0]):
        entry = Entry(key)
        for _, _, _, table, rec in group:
            entry.lines.setdefault(table, []).append(rec)
        yield entry


def derived_key_clashes(wav_scp: Path) -> dict[str, str]:
    """{key: X} of every wav.scp key ``sp<number>-X`` whose X is a wav.scp key too: stage 1 would give
    X's speed-perturbed copy that name as well, and two lines one ark offset.

    Two streamed passes over the keys, in bytes: the first keeps only the candidates' X (such keys are
    rare), the second looks for them, so memory does not grow with the corpus.
    """
    candidates: dict[bytes, list[bytes]] = {}
    with open_table(wav_scp) as f:
        for lineno, raw in enumerate(iter_lines(f), start=1):
            key = first_field(raw, lineno)
            if key is not None and key.startswith(b"sp") and (m := DERIVED_KEY.fullmatch(key)):
                candidates.setdefault(m.group(1), []).append(key)
    clashes: dict[str, str] = {}
    if not candidates:
        return clashes
    with open_table(wav_scp) as f:
        for lineno, raw in enumerate(iter_lines(f), start=1):
            key = first_field(raw, lineno)
            if key is None or key not in candidates:
                continue
            for derived in candidates.pop(key):
                # decoded as parse_line decodes keys, so that the merged entries' keys match
                clashes[derived.decode("utf-8", "backslashreplace")] = key.decode("utf-8", "backslashreplace")
            if not candidates:
                break
    return clashes


def check_text(entry: Entry, set_dir: Path, opts: argparse.Namespace, has_utt2spk: bool,
               clashes: dict[str, str] | None = None) -> Rejection | None:
    """Checks that need no audio, in the order a person fixing the data would want them; ``clashes``
    is derived_key_clashes' answer for the set."""

    def reject(table: str, rec: Record | None, reason: str, detail: str) -> Rejection:
        return Rejection(str(set_dir / table), rec.lineno if rec else None, entry.key, reason, detail)

    for table, recs in entry.lines.items():
        for rec in recs:
            if rec.error == "non_utf8":
                return reject(table, rec, "non_utf8", rec.detail)
    for table, recs in entry.lines.items():
        if len(recs) > 1:
            lines = ", ".join(str(r.lineno) for r in recs)
            return reject(table, recs[0], "duplicate_key", f"key appears {len(recs)} times (lines {lines})")
    audio = opts.audio_table
    wav, text = entry.one(audio), entry.one("text")
    if wav is None:
        return reject("text", text, f"missing_in_{audio.replace('.', '_')}",
                      "key has a transcript but no audio entry")
    if text is None:
        return reject(audio, wav, "missing_in_text", "key has audio but no transcript")
    if wav.error in SEGMENT_ERRORS:
        return reject(audio, wav, wav.error, wav.detail)
    if not wav.value:
        return reject(audio, wav, "malformed_line", "no audio path after the key")
    if clashes and (base := clashes.get(entry.key)) is not None:
        return reject(audio, wav, "derived_key_clash",
                      f"stage 1 names the speed-perturbed copies of {base!r} so ({entry.key!r} is one of "
                      f"them), and {base!r} is in this set too: rename this key")
    for table, recs in entry.lines.items():
        if recs[0].error == "control_chars":
            return reject(table, recs[0], "control_chars", recs[0].detail)
    if not text.value.strip():
        return reject("text", text, "empty_transcript", "transcript is empty or whitespace only")
    if has_utt2spk and entry.one("utt2spk") is None:
        return reject(audio, wav, "missing_in_utt2spk", "utt2spk exists but has no speaker for this key")
    for table, (kind, reason) in TAG_TABLES.items():
        rec = entry.one(table)
        if rec is not None and canonical_tag(kind, rec.value) is None:
            return reject(table, rec, reason,
                          f"{rec.value!r} is not a SenseVoice {kind} tag; {valid_names(kind)}")
    if is_pipe(wav.value) and not opts.allow_pipes:
        return reject(audio, wav, "pipe_refused", f"pipe entry {wav.value!r}; pass --allow-pipes true")
    return None


def _probe(source: str) -> AudioInfo | AudioError:
    try:
        return probe_audio(source)
    except AudioError as e:
        return e


def jsonl_line(entry: Entry, info: AudioInfo, opts: argparse.Namespace) -> str:
    """The entry's line of data.jsonl: its transcript, audio and tags (its own, else the declared ones)."""
    tags = {}
    for table, (kind, _) in TAG_TABLES.items():
        rec = entry.one(table)
        tags[kind] = canonical_tag(kind, rec.value if rec else getattr(opts, kind))
    speaker = entry.one("utt2spk")
    return manifest_line(entry.key, entry.one(opts.audio_table).value, info, entry.one("text").value, tags,
                         tags.pop("itn"), speaker.value if speaker else entry.key)


def validate_set(set_dir: Path, language: str = "en", emotion: str = "NEUTRAL", event: str = "Speech",
                 itn: str = "woitn", nj: int = 1, strict: bool = False, allow_pipes: bool = False,
                 max_duration: float = 60.0) -> dict:
    """Validate one Kaldi data dir and write data.jsonl, rejected.tsv and report.json; returns the report."""
    opts = argparse.Namespace(language=language, emotion=emotion, event=event, itn=itn,
                              allow_pipes=allow_pipes)
    for kind in ("language", "emotion", "event", "itn"):
        if canonical_tag(kind, getattr(opts, kind)) is None:
            raise BadInputError(f"declared {kind} {getattr(opts, kind)!r} is not a SenseVoice tag; "
                                f"{valid_names(kind)}")
    for required in ("wav.scp", "text"):
        try:  # Path.is_file() would raise a bare PermissionError for a directory this user may not enter
            is_file = stat.S_ISREG(os.stat(set_dir / required).st_mode)
        except PermissionError:
            raise TableError(f"{set_dir / required}: permission denied: this user cannot reach it (check the "
                             "mode and owner of its directories)") from None
        except OSError:
            is_file = False
        if not is_file:
            raise FileNotFoundError(f"{set_dir / required} is missing: a Kaldi data dir needs wav.scp, text")
    has_utt2spk = (set_dir / "utt2spk").is_file()
    audio = opts.audio_table = audio_table(set_dir)  # after the checks above: the dir may be unreadable
    clashes = derived_key_clashes(set_dir / audio)
    reasons: Counter[str] = Counter()
    stats = {"sample_rates": Counter(), "channels": Counter(), "subtypes": Counter()}
    converted = Counter({"resampled": 0, "downmixed": 0, "requantized": 0})
    accepted = seconds = 0
    dur_min, dur_max = float("inf"), 0.0
    blank: dict[str, list[int]] = {}
    progress = Progress(f"{set_dir}: validating", count_lines(set_dir / audio), logger=log)
    jsonl_tmp, rej_tmp = set_dir / "data.jsonl.tmp", set_dir / "rejected.tsv.tmp"

    def rejected(r: Rejection, out) -> None:
        if strict:
            raise r.fatal()
        reasons[r.reason] += 1
        out.write(r.tsv())

    pool = mp.get_context("fork").Pool(nj) if nj > 1 else None
    try:
        with tempfile.TemporaryDirectory(prefix="prepare_data.") as tmp, \
                open(jsonl_tmp, "w", encoding="utf-8") as out, open(rej_tmp, "w", encoding="utf-8") as rej:
            rej.write(REJECTED_HEADER)
            entries = merged_entries(set_dir, Path(tmp), blank)
            while batch := list(itertools.islice(entries, BATCH)):
                checked = [(e, check_text(e, set_dir, opts, has_utt2spk, clashes)) for e in batch]
                sources = [e.one(audio).value for e, r in checked if r is None]
                infos = iter(pool.map(_probe, sources, chunksize=16) if pool else map(_probe, sources))
                for entry, rejection in checked:
                    info = next(infos) if rejection is None else None
                    wav = entry.one(audio)
                    if isinstance(info, AudioError):
                        rejection = Rejection(str(set_dir / audio), wav.lineno, entry.key, info.reason,
                                              info.detail)
                    elif info is not None and info.duration > max_duration:
                        rejection = Rejection(str(set_dir / audio), wav.lineno, entry.key, "too_long",
                                              f"{info.duration:.1f}s > --max-duration {max_duration:g}s")
                    elif info is not None and info.duration < MIN_DURATION_S:
                        rejection = Rejection(str(set_dir / audio), wav.lineno, entry.key, "too_short",
                                              f"{info.frames} samples at {info.sample_rate} Hz: "
                                              f"{info.duration * 1000:.2f} ms < {MIN_DURATION_S * 1000:g} "
                                              "ms, one fbank frame")
                    if rejection is not None:
                        rejected(rejection, rej)
                    else:
                        out.write(jsonl_line(entry, info, opts))
                        accepted += 1
                        seconds += info.duration
                        dur_min, dur_max = min(dur_min, info.duration), max(dur_max, info.duration)
                        stats["sample_rates"][str(info.sample_rate)] += 1
                        stats["channels"][str(info.channels)] += 1
                        stats["subtypes"][info.subtype] += 1
                        converted["resampled"] += info.sample_rate != TARGET_RATE
                        converted["downmixed"] += info.channels > 1
                        converted["requantized"] += info.subtype != "PCM_16"
                progress.update(len(batch))
    finally:
        if pool:
            pool.terminate()
        for tmp_file in (jsonl_tmp, rej_tmp):  # left behind only when strict mode stopped early
            if tmp_file.exists() and sys.exc_info()[0] is not None:
                tmp_file.unlink()
    progress.close()
    jsonl_tmp.replace(set_dir / "data.jsonl")
    rej_tmp.replace(set_dir / "rejected.tsv")
    n_rejected = sum(reasons.values())
    report = {
        "set": set_dir.name,
        "set_dir": str(set_dir),
        "input_entries": accepted + n_rejected,
        "accepted": accepted,
        "rejected": n_rejected,
        "rejected_by_reason": dict(sorted(reasons.items())),
        "converted": dict(converted),
        "hours": round(seconds / 3600, 4),
        "duration_s": {"min": round(dur_min, 3) if accepted else None, "max": round(dur_max, 3)},
        **{k: dict(sorted(v.items())) for k, v in stats.items()},
        "blank_lines_ignored": {k: v for k, v in blank.items() if v},
        "options": {"language": language, "emotion": emotion, "event": event, "itn": itn,
                    "allow_pipes": allow_pipes, "max_duration": max_duration, "min_duration": MIN_DURATION_S,
                    "target_rate": TARGET_RATE},
    }
    (set_dir / "report.json").write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n",
                                         encoding="utf-8")
    return report
