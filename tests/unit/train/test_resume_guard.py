"""Stage 2's resume guard: checkpoints are continued only under the settings they were trained with."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from funasr_recipe.core.rejections import BadInputError
from funasr_recipe.model.provenance import run_options
from funasr_recipe.train import resume_guard

ROOT = Path(__file__).resolve().parents[3]
CONFIG = ROOT / "conf" / "tiny_sensevoice.yaml"
DS = ROOT / "ds_configs" / "ds_stage1_bf16.json"


def ident(tmp: Path, *overrides: str, config: Path = CONFIG, **options: str) -> dict[str, str]:
    marker = tmp / "dump.done"
    if not marker.exists():
        marker.write_text("fp-1\n")
    return resume_guard.identity(config, list(overrides), DS, {"train-set": "train", **options}, marker, None)


def trained_exp(tmp: Path, identity: dict[str, str]) -> Path:
    exp = tmp / "exp"
    (exp / "log").mkdir(parents=True)
    (exp / "model.pt").write_bytes(b"weights")
    (exp / "model.pt.ep1").write_bytes(b"weights")
    (exp / "config.yaml").write_text("old\n")
    resume_guard.record(exp, identity)
    return exp


def test_a_changed_override_is_named_old_to_new(tmp_path: Path) -> None:
    exp = trained_exp(tmp_path, ident(tmp_path))
    with pytest.raises(BadInputError) as e:
        resume_guard.check(exp, ident(tmp_path, "++dataset_conf.batch_size=4000"), restart=False)
    assert "config.dataset_conf.batch_size: 3000 -> 4000" in str(e.value)
    assert "--restart true" in str(e.value)
    assert (exp / "model.pt").read_bytes() == b"weights"


def test_an_edited_config_file_under_the_same_name_is_named(tmp_path: Path) -> None:
    exp = trained_exp(tmp_path, ident(tmp_path))
    edited = tmp_path / "conf" / CONFIG.name
    edited.parent.mkdir()
    edited.write_text(CONFIG.read_text().replace("lr: 0.002", "lr: 0.0005"))
    assert edited.read_text() != CONFIG.read_text(), "the config's lr line moved: update the test"
    with pytest.raises(BadInputError, match=r"config.optim_conf.lr: 0.002 -> 0.0005"):
        resume_guard.check(exp, ident(tmp_path, config=edited), restart=False)


def test_other_data_options_and_world_size_are_differences(tmp_path: Path) -> None:
    exp = trained_exp(tmp_path, ident(tmp_path, **{"world-size": "2"}))
    (tmp_path / "dump.done").write_text("fp-2\n")
    with pytest.raises(BadInputError) as e:
        resume_guard.check(exp, ident(tmp_path, **{"world-size": "4", "train-set": "train_sp"}),
                           restart=False)
    text = str(e.value)
    assert "3 difference(s)" in text
    assert 'option.world-size: "2" -> "4"' in text and "fp-1" in text and "fp-2" in text


def test_logging_keys_and_a_longer_run_may_resume_but_a_shorter_may_not(tmp_path: Path) -> None:
    exp = trained_exp(tmp_path, ident(tmp_path))
    ok = ident(tmp_path, "++train_conf.log_interval=1", "++train_conf.max_epoch=20")
    assert resume_guard.check(exp, ok, restart=False) == "resume"
    with pytest.raises(BadInputError, match=r"config.train_conf.max_epoch: 12 -> 3"):
        resume_guard.check(exp, ident(tmp_path, "++train_conf.max_epoch=3"), restart=False)


def test_checkpoints_of_unknown_settings_are_refused(tmp_path: Path) -> None:
    exp = trained_exp(tmp_path, ident(tmp_path))
    (exp / resume_guard.IDENTITY).unlink()
    with pytest.raises(BadInputError, match="no train_identity.json"):
        resume_guard.check(exp, ident(tmp_path), restart=False)


def test_no_checkpoint_is_a_fresh_start(tmp_path: Path) -> None:
    (tmp_path / "exp").mkdir()
    assert resume_guard.check(tmp_path / "exp", ident(tmp_path), restart=False) == "fresh"


def test_restart_moves_the_old_run_aside_and_deletes_nothing(tmp_path: Path) -> None:
    exp = trained_exp(tmp_path, ident(tmp_path))
    (exp / "log" / "now.log").write_text("this run\n")
    new = ident(tmp_path, "++dataset_conf.batch_size=4000")
    assert resume_guard.check(exp, new, restart=True) == "restart"
    assert sorted(p.name for p in exp.iterdir()) == ["log", "superseded"]
    (old,) = (exp / "superseded").iterdir()
    assert sorted(p.name for p in old.iterdir()) == ["config.yaml", "model.pt", "model.pt.ep1",
                                                     "train_identity.json"]
    assert (old / "model.pt").read_bytes() == b"weights"


def test_the_program_exits_2_before_training(tmp_path: Path) -> None:
    exp = trained_exp(tmp_path, ident(tmp_path, **{"world-size": "1"}))
    cmd = [sys.executable, "-m", "local.marker", "resume", str(exp), "--config", str(CONFIG), "--ds-config",
           str(DS), "--dump-marker", str(tmp_path / "dump.done"), "--world-size", "1",
           "--train-opts", "--train-set train --exp-dir /elsewhere", "--", "++optim_conf.lr=0.01"]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2, res.stderr
    assert "config.optim_conf.lr: 0.002 -> 0.01" in res.stderr
    res = subprocess.run(cmd[:-1] + ["++train_conf.log_interval=3"], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    # The exp dir by the name the run was given it (the record was made with none: never compared).
    assert run_options(exp) == {"exp-dir": "/elsewhere", "train-set": "train", "world-size": "1"}


def test_the_paths_are_recorded_by_name_and_never_compared(tmp_path: Path) -> None:
    """given.*: the config, pretrained dir and exp dir as named, for the results (model/provenance.py);
    their contents are what the identity compares, so a copy of the config under another name resumes."""
    marker = tmp_path / "dump.done"
    marker.write_text("fp-1\n")
    old = resume_guard.identity(CONFIG, [], DS, {"train-set": "train"}, marker, None,
                                {"config": "conf/tiny_sensevoice.yaml", "exp-dir": "exp"})
    exp = trained_exp(tmp_path, old)
    copy = tmp_path / "mine.yaml"
    copy.write_text(CONFIG.read_text())
    new = resume_guard.identity(copy, [], DS, {"train-set": "train"}, marker, None,
                                {"config": str(copy), "exp-dir": str(exp)})
    assert resume_guard.check(exp, new, restart=False) == "resume"
    assert run_options(exp)["config"] == "conf/tiny_sensevoice.yaml"
    resume_guard.record(exp, new)
    assert run_options(exp)["config"] == str(copy)
