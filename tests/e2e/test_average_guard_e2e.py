"""Stage 3's checked average on a real run (``trained``: 16 epochs, DeepSpeed ZeRO-1 bf16, 2 ranks): the
average and the best checkpoint scored on the run's validation set (stage-1 features, the fp32 masters),
final chosen by those losses and recorded, funasr's own model.pt.avg<n> gone, and the count taken from
the overrides after --.

The fallback itself (an average worse than the best) is tested on a tiny model with known weights in
tests/unit/model/test_averaging_guard.py: on a real run it depends on how training went.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers.run_sh import CLEAN_ENV, ROOT

pytestmark = pytest.mark.slow


def recipe(final: Path) -> dict:
    return json.loads((final / "configuration.json").read_text())["recipe"]


def test_stage_3_scored_the_average_and_the_best_and_chose_by_them(trained: Path) -> None:
    card = recipe(trained / "final")
    averaged = list(card["averaged"])
    average, best = f"model.pt.avg{len(averaged)}", averaged[0]
    check = card["validation"]
    assert check["checked"] is True and set(check["losses"]) == {average, best}
    losses = check["losses"]
    assert card["checkpoint"] == check["chosen"] == (average if losses[average] <= losses[best] else best)
    # Scored on the validation set stage 2 used, not read from its record (bf16 copies, 2 ranks).
    assert Path(check["set"]).parent.name == "dev"
    assert abs(losses[best] - card["averaged"][best]) < 0.2 * card["averaged"][best]
    assert [p.name for p in trained.glob("model.pt.avg*")] == [average]  # funasr's own is gone
    assert "validation loss on" in (trained / "run.stderr").read_text()


def test_an_override_after_dashes_makes_final_the_best_epoch(trained: Path, tmp_path: Path) -> None:
    exp = tmp_path / "exp"
    shutil.copytree(trained, exp, ignore=shutil.ignore_patterns("final", "decode_*", "export", "package*"))
    res = subprocess.run([str(ROOT / ".venv/bin/python"), "-m", "local.average", "--exp-dir", str(exp),
                          "--", "++train_conf.max_epoch=16", "++train_conf.avg_nbest_model=1"], cwd=ROOT,
                         capture_output=True, text=True, env=CLEAN_ENV)
    assert res.returncode == 0, res.stderr[-3000:]
    card = recipe(exp / "final")
    assert card["checkpoint"] == next(iter(recipe(trained / "final")["averaged"]))  # the best epoch's
    assert card["checkpoint"].startswith("model.pt.ep") and not list(exp.glob("model.pt.avg*"))
