"""bench/bench_loso.py: the folds it runs and the figures it reports (the runs themselves are the
end-to-end tests' business; a fold is ./run.sh stages 0-3)."""

from __future__ import annotations

import json
from pathlib import Path

from bench.bench_loso import corpus_speakers, fold_command, fold_result, table
from funasr_recipe.scoring.across_runs import pooled_rate
from recipes.fsdd import BUNDLED


def _result(path: Path, n_ref: int, sub: int, dele: int, ins: int, missing: list[str]) -> Path:
    counts = {"rate": (sub + dele + ins) / n_ref, "n_ref": n_ref, "sub": sub, "del": dele, "ins": ins,
              "cor": n_ref - sub - dele}
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"utterances": n_ref, "cer": counts, "wer": counts, "missing_hyp": missing,
                                "empty_hyp": [], "tag_accuracy": {"language": {"accuracy": 1.0}}}))
    return path


def test_folds_cover_every_bundled_speaker_as_test_only() -> None:
    assert corpus_speakers(BUNDLED) == ["george", "jackson", "lucas", "nicolas", "theo"]
    cmd = fold_command("lucas", Path("/w"), "conf/tiny_sensevoice.yaml", BUNDLED, ["--nj", "2"])
    assert cmd[cmd.index("--prep-opts") + 1] == "--dev-speakers none --test-speakers lucas"
    assert cmd[cmd.index("--exp-dir") + 1] == "/w/lucas/exp" and cmd[-2:] == ["--nj", "2"]
    assert cmd[cmd.index("--stop-stage") + 1] == "3"


def test_pooled_and_mean_rates(tmp_path: Path) -> None:
    a = fold_result("a", _result(tmp_path / "a/result.json", 100, 5, 3, 2, ["a-1"]), 60.0)
    b = fold_result("b", _result(tmp_path / "b/result.json", 300, 6, 0, 0, []), 120.0)
    assert a["missing_or_empty"] == 1 and a["language_tag_accuracy"] == 1.0
    assert pooled_rate([a, b], "wer") == 16 / 400  # not the mean of 10% and 2%
    text = table([a, b], "conf/x.yaml")
    assert "| a | 100 | 10.00 | 10.00 | 1 | 1.0 min |" in text
    assert "| mean of 2 folds | 400 | 6.00 | 6.00 |" in text and "| pooled | | 4.00 | 4.00 |" in text
