"""Kaldi ``segments``: utterances that are time ranges of the recordings of ``wav.scp``.

Reads  <set-dir>/segments (``<utterance> <recording> <start> <end>``, seconds; end -1 is Kaldi's "to
       the end of the recording") and <set-dir>/wav.scp, keyed by recording;
yields one Record per segments line, keyed by utterance, whose value is the recording's entry with the
time range appended (``/a/rec.flac#t=1.5,3.25``: features/audio.py reads only that range), so the
validator treats a segment as it treats a wav.scp line of a whole-file utterance. Nothing is cut to
disk. A line that cannot be resolved carries its reason (malformed_segment, bad_segment,
missing_recording, duplicate_recording) as the Record's error, for the validator to reject it with
this file and line; whether the range lies inside its recording is checked with the audio's header,
when the validator probes it (segment_past_end).

  for rec in resolve_segments(Path("data/train"), blank_lines=[]): ...
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

from funasr_recipe.data.kaldi_table import Record, iter_lines, open_table, parse_line
from funasr_recipe.features.audio import with_range

# The reasons a segments line is rejected with before any audio is read.
SEGMENT_ERRORS = ("malformed_segment", "bad_segment", "missing_recording", "duplicate_recording")


def read_recordings(wav_scp: Path) -> tuple[dict[str, str], set[str]]:
    """({recording: entry} of wav.scp's well-formed lines, the recordings listed more than once)."""
    entries: dict[str, str] = {}
    repeated: set[str] = set()
    with open_table(wav_scp) as f:
        for lineno, raw in enumerate(iter_lines(f), start=1):
            rec = parse_line(raw, lineno)
            if rec is None or rec.error is not None or not rec.value:
                continue  # a segment of such a recording is rejected as missing_recording, naming it
            if rec.key in entries:
                repeated.add(rec.key)
            entries.setdefault(rec.key, rec.value)
    return entries, repeated


def resolve_segments(set_dir: Path, blank_lines: list[int] | None = None) -> Iterator[Record]:
    """Every non-blank line of set_dir/segments as a Record of its utterance (see the module's doc)."""
    wav_scp = set_dir / "wav.scp"
    recordings, repeated = read_recordings(wav_scp)
    with open_table(set_dir / "segments") as f:
        for lineno, raw in enumerate(iter_lines(f), start=1):
            rec = parse_line(raw, lineno)
            if rec is None:
                if blank_lines is not None:
                    blank_lines.append(lineno)
                continue
            yield rec if rec.error is not None else _resolve(rec, recordings, repeated, wav_scp)


def _resolve(rec: Record, recordings: dict[str, str], repeated: set[str], wav_scp: Path) -> Record:
    def bad(reason: str, detail: str) -> Record:
        return Record(rec.key, rec.lineno, "", reason, detail)

    fields = rec.value.split()
    if len(fields) != 3:
        return bad("malformed_segment", f"expected '<utterance> <recording> <start> <end>', got "
                   f"{rec.key} {rec.value!r}")
    recording, start_s, end_s = fields
    try:
        start, end = float(start_s), float(end_s)
    except ValueError:
        return bad("malformed_segment", f"start and end must be seconds, got {start_s!r} and {end_s!r}")
    if not (math.isfinite(start) and math.isfinite(end)) or start < 0 or (end <= start and end != -1):
        return bad("bad_segment", f"the range {start_s}-{end_s}s is empty, reversed or negative")
    if recording in repeated:
        return bad("duplicate_recording", f"recording {recording!r} is listed more than once in {wav_scp}")
    entry = recordings.get(recording)
    if entry is None:
        return bad("missing_recording", f"recording {recording!r} has no usable line in {wav_scp}")
    if end == -1:  # to the end of the recording
        return Record(rec.key, rec.lineno, entry if start == 0 else with_range(entry, start, None))
    return Record(rec.key, rec.lineno, with_range(entry, start, end))
