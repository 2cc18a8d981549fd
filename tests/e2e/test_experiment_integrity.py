"""A rerun under other settings never relabels an old model (issue #30, item 1), through run.sh.

``trained`` is the 16-epoch DeepSpeed run of tests/helpers/train_fixtures.py; each test works on a copy.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.helpers.run_sh import run_sh
from tests.helpers.train_fixtures import LEARN, dirs

pytestmark = pytest.mark.slow


def copy_of(trained: Path, prepared: Path, name: str) -> Path:
    exp = prepared / name
    shutil.copytree(trained, exp, ignore=shutil.ignore_patterns("export", "package*"))
    return exp


def test_a_changed_override_stops_stage_2_naming_it_and_restart_sets_the_old_run_aside(
        prepared: Path, trained: Path) -> None:
    exp = copy_of(trained, prepared, "exp_changed")
    weights = (exp / "model.pt").stat().st_mtime_ns
    changed = [o for o in LEARN if not o.startswith("++dataset_conf.batch_size")]
    changed.append("++dataset_conf.batch_size=4000")
    start = time.monotonic()
    res = run_sh("--stage", "2", "--stop-stage", "3", *dirs(prepared, "exp_changed"), "--", *changed)
    took = time.monotonic() - start
    assert res.returncode == 2, res.stderr[-3000:]
    assert "config.dataset_conf.batch_size: 1500 -> 4000" in res.stderr
    assert "torchrun" not in res.stderr and took < 60, took  # before any process of training started
    assert (exp / "model.pt").stat().st_mtime_ns == weights
    assert OmegaConf.load(exp / "config.yaml").dataset_conf.batch_size == 1500

    one = [o for o in changed if not o.startswith("++train_conf.max_epoch")] + ["++train_conf.max_epoch=1"]
    res = run_sh("--stage", "2", "--stop-stage", "2", "--restart", "true", *dirs(prepared, "exp_changed"),
                 "--", *one, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    (old,) = (exp / "superseded").iterdir()
    assert (old / "model.pt.ep16").exists() and (old / "final" / "model.pt").exists()
    assert not (exp / "model.pt.ep16").exists() and (exp / "model.pt.ep1").exists()
    assert OmegaConf.load(exp / "config.yaml").dataset_conf.batch_size == 4000
    assert OmegaConf.load(old / "config.yaml").dataset_conf.batch_size == 1500
    # The same settings again: done, and the restart option is not replayed.
    res = run_sh("--stage", "2", "--stop-stage", "2", *dirs(prepared, "exp_changed"), "--", *one)
    assert res.returncode == 0 and "is trained; skipping" in res.stderr
    assert "--restart" not in (exp / "replay.sh").read_text()
