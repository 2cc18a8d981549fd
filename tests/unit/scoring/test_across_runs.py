"""funasr_recipe/scoring/across_runs.py: one row per run's result.json, and what a broken one says."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from funasr_recipe.scoring.across_runs import mean_rate, pooled_rate, run_row


def _write(path: Path, n_ref: int, errors: int) -> Path:
    counts = {"rate": errors / n_ref, "n_ref": n_ref, "sub": errors, "del": 0, "ins": 0,
              "cor": n_ref - errors}
    path.write_text(json.dumps({"utterances": n_ref, "cer": counts, "wer": counts, "missing_hyp": ["k1"],
                                "empty_hyp": ["k2", "k3"], "tag_accuracy": {}}))
    return path


def test_rows_mean_and_pooled(tmp_path: Path) -> None:
    rows = [run_row(_write(tmp_path / "a.json", 100, 10)), run_row(_write(tmp_path / "b.json", 300, 6))]
    assert rows[0]["missing_or_empty"] == 3 and rows[0]["language_tag_accuracy"] is None
    assert mean_rate(rows, "wer") == pytest.approx(0.06) and pooled_rate(rows, "wer") == 16 / 400


@pytest.mark.parametrize("text", ["", "{not json", "[]", '{"utterances": 5}'],
                         ids=["empty", "broken", "not-an-object", "keys-missing"])
def test_an_unreadable_result_is_named(tmp_path: Path, text: str) -> None:
    (tmp_path / "result.json").write_text(text)
    with pytest.raises(ValueError, match=r"result.json: not a stage-3 result.json"):
        run_row(tmp_path / "result.json")


def test_a_missing_result_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="result.json"):
        run_row(tmp_path / "result.json")
