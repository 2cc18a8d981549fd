"""Error rates across several runs of one config (leave-one-speaker-out folds, training seeds).

Reads each run's stage-3 ``decode_<set>/result.json`` (funasr_recipe/scoring/score.py writes it); writes
nothing: the benchmarks under bench/ print and store the rows.

  rows = [run_row(Path(d) / "decode_dev" / "result.json") for d in run_dirs]
  mean_rate(rows, "wer"), pooled_rate(rows, "wer")
"""

from __future__ import annotations

import json
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
