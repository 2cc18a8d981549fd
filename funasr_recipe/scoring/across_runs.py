"""Figures of finished runs that the benchmarks compare (leave-one-speaker-out folds, training seeds,
fine-tunes): error rates and their means, and stage 2's training time.

Reads each run's stage-3 ``decode_<set>/result.json`` (funasr_recipe/scoring/score.py writes it) and
stage 2's train.log; writes nothing: the benchmarks under bench/ print and store the rows.

  rows = [run_row(Path(d) / "decode_dev" / "result.json") for d in run_dirs]
  mean_rate(rows, "wer"), pooled_rate(rows, "wer")
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path

from funasr_recipe.core.rejections import BadInputError


def run_row(result_json: Path) -> dict:
    """One run's figures: utterances, the cer/wer counts, language-tag accuracy, missing or empty hyps.
    A missing file is FileNotFoundError, an unreadable one ValueError, each naming the file."""
    try:
        res = json.loads(result_json.read_text(encoding="utf-8"))
        tags = res.get("tag_accuracy") or {}
        return {"utterances": res["utterances"], "cer": res["cer"], "wer": res["wer"],
                "language_tag_accuracy": (tags.get("language") or {}).get("accuracy"),
                "missing_or_empty": len(res["missing_hyp"]) + len(res["empty_hyp"])}
    except (ValueError, KeyError, TypeError, AttributeError) as e:  # JSONDecodeError is a ValueError
        raise BadInputError(f"{result_json}: not a stage-3 result.json ({type(e).__name__}: {e}): "
                            "rerun stage 3") from None


def pooled_rate(rows: list[dict], unit: str) -> float:
    """Error rate over every run's tokens together (errors / reference tokens)."""
    errors = sum(r[unit]["sub"] + r[unit]["del"] + r[unit]["ins"] for r in rows)
    return errors / max(1, sum(r[unit]["n_ref"] for r in rows))


def mean_rate(rows: list[dict], unit: str) -> float:
    """The mean of the runs' error rates (each run weighs the same)."""
    return sum(r[unit]["rate"] for r in rows) / len(rows)


def language_rate(result_json: Path, language: str) -> float | None:
    """A decode dir's error rate (%) for one language in its primary unit, None when not decoded."""
    if not result_json.is_file():
        return None
    res = json.loads(result_json.read_text(encoding="utf-8"))
    lang = (res.get("per_language") or {}).get(language)
    return None if lang is None else 100.0 * float(lang["rate"])


_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)")  # a log line's time stamp
# train.log: a rank starts (torchaudio's first words in each process); a run trains from epoch 0.
_RUN_START, _EPOCH0 = "Notice: ffmpeg is not installed", "Train epoch: 0, rank: 0"


def train_seconds(train_log: Path) -> float | None:
    """Stage 2's wall time: the span of the run in its log (run.sh appends every run) that trained from
    epoch 0, from the start of its ranks to the last line before the next run's."""
    runs: list[list[str]] = []
    for line in train_log.open(encoding="utf-8") if train_log.is_file() else ():
        if not runs or (_RUN_START in line and any(_STAMP.match(x) for x in runs[-1])):
            runs.append([])
        runs[-1].append(line)
    for lines in runs:
        if any(_EPOCH0 in line for line in lines):
            stamps = [datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")
                      for m in map(_STAMP.match, lines) if m]
            return (stamps[-1] - stamps[0]).total_seconds() if len(stamps) > 1 else None
    return None
