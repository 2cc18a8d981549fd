"""bench/bench_adapt.py: the new speaker's sets, the fine-tune it runs and the figures it reports (the
runs themselves are stage programs tested elsewhere)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.bench_adapt import cell, finetune_command, scored_cell, speaker_sets, summary, table, variant_args
from recipes.fsdd import BUNDLED


def test_sets_are_the_first_takes_and_fixed_dev_and_test() -> None:
    sets = speaker_sets(BUNDLED, "theo", 150)
    assert [len(sets[k]) for k in ("train", "dev", "test")] == [150, 50, 300]
    takes = {k: {int(u.key.rsplit("_", 1)[1]) for u in v} for k, v in sets.items()}
    assert takes["train"] == set(range(15)) and takes["dev"] == set(range(15, 20))
    assert takes["test"] == set(range(20, 50))
    small = speaker_sets(BUNDLED, "theo", 50)
    assert len(small["train"]) == 50 and small["test"] == sets["test"] and small["dev"] == sets["dev"]
    assert {u.text for u in small["train"]} == {"ZERO", "ONE", "TWO", "THREE", "FOUR", "FIVE", "SIX", "SEVEN",
                                               "EIGHT", "NINE"}
    with pytest.raises(ValueError, match="N=155"):
        speaker_sets(BUNDLED, "theo", 155)
    with pytest.raises(ValueError, match="N=160"):
        speaker_sets(BUNDLED, "theo", 160)  # would reach into the dev takes


def test_the_fine_tune_is_the_users_command_plus_the_variant() -> None:
    assert variant_args(["--replay-ratio", "2", "++optim_conf.lr=0.001"]) == (
        ["--replay-ratio", "2"], ["++optim_conf.lr=0.001"])
    assert variant_args(["--freeze", "encoder", "--", "++train_conf.max_epoch=3"]) == (
        ["--freeze", "encoder"], ["++train_conf.max_epoch=3"])
    cmd = finetune_command(Path("/w/r"), Path("/w/c"), Path("/l/theo"), 3, ["--replay-ratio", "2",
                                                                            "++optim_conf.lr=0.001"])
    assert cmd[cmd.index("--config") + 1] == "conf/sensevoice_small.yaml"
    assert cmd[cmd.index("--pretrained-dir") + 1] == "/l/theo/exp/final"
    assert cmd[cmd.index("--regression-dir") + 1] == "/l/theo/data/dev"
    assert cmd[cmd.index("--replay-dir") + 1] == "/l/theo/data/train"
    assert cmd[cmd.index("--") - 2: cmd.index("--") + 1] == ["--replay-ratio", "2", "--"]
    assert cmd[cmd.index("--") + 1:] == ["++dataset_conf.num_workers=1", "++seed=3", "++optim_conf.lr=0.001"]


def _result(path: Path, rate: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"per_language": {"en": {"rate": rate}}}))


def _run(tmp: Path, name: str, base: float, tuned: float, reg_base: float, reg: float) -> Path:
    exp = tmp / name / "exp"
    _result(exp / "decode_test_pretrained" / "result.json", base)
    _result(exp / "decode_test" / "result.json", tuned)
    _result(exp / "decode_regress_dev_pretrained" / "result.json", reg_base)
    _result(exp / "decode_regress_dev" / "result.json", reg)
    return tmp / name


def test_figures_and_means(tmp_path: Path) -> None:
    cells = [cell(_run(tmp_path, "a0", 0.40, 0.20, 0.10, 0.11), "a", 150, 0, 0),
             cell(_run(tmp_path, "a1", 0.40, 0.30, 0.10, 0.10), "a", 150, 1, 0),
             cell(_run(tmp_path, "b0", 0.10, 0.12, 0.05, 0.08), "b", 150, 0, 1),
             cell(_run(tmp_path, "b1", 0.10, 0.08, 0.05, 0.06), "b", 150, 1, 0)]
    assert cells[0]["relative_reduction"] == pytest.approx(0.5)
    assert cells[0]["regression_points"] == pytest.approx(1.0)
    (row,) = summary(cells)
    # a: mean of 50% and 25%; b: mean of -20% and +20%: the mean over speakers of their seed means.
    assert row["relative_reduction"] == pytest.approx((0.375 + 0.0) / 2)
    assert row["improved"] == 1 and row["worst_regression"] == pytest.approx(2.0)
    assert row["reduction_by_seed"] == pytest.approx([(0.5 - 0.2) / 2, (0.25 + 0.2) / 2])
    text = table(cells, "default")
    assert "| a | 150 | 0 | 40.0 | 20.0 | 50.0 | 1.0 | - | 0 |" in text
    assert "| 150 | 2 | 0,1 | 25.0 | 17.5 | 18.8 | 1/2 | 1.2 / 2.0 | 15.0 22.5 | - |" in text


def test_a_missing_decode_is_not_a_figure(tmp_path: Path) -> None:
    c = cell(tmp_path / "nothing", "a", 50, 0, 1)
    assert c["base_wer"] is None and c["relative_reduction"] is None and c["regression_points"] is None
    assert summary([c])[0]["relative_reduction"] is None


def test_no_replay_leaves_out_the_replay_dir() -> None:
    cmd = finetune_command(Path("/w/r"), Path("/w/c"), Path("/l/theo"), 0, [], replay=False)
    assert cmd[cmd.index("--replay-dir") + 1] == "none"
    assert cmd[cmd.index("--regression-dir") + 1] == "/l/theo/data/dev"


def test_a_base_that_records_its_training_set_is_replayed_by_run_shs_default(tmp_path: Path) -> None:
    fold = tmp_path / "theo"
    (fold / "data" / "train").mkdir(parents=True)
    (fold / "data" / "train" / "wav.scp").write_text("a /a.wav\n")
    (fold / "exp" / "final").mkdir(parents=True)
    (fold / "exp" / "final" / "configuration.json").write_text(json.dumps(
        {"recipe": {"train_data": str(fold / "data" / "train")}}))
    assert "--replay-dir" not in finetune_command(tmp_path / "r", tmp_path / "c", fold, 0, [])


def test_a_scored_fine_tune_loses_its_checkpoints_and_is_read_back(tmp_path: Path) -> None:
    run = _run(tmp_path, "r", 0.40, 0.20, 0.10, 0.11)
    (run / "exp" / "model.pt.ep1").mkdir()
    (run / "exp" / "model.pt.ep1" / "mp_rank_00_model_states.pt").write_bytes(b"x")
    (run / "exp" / "model.pt").write_bytes(b"x")
    failed = scored_cell(["false"], run, "a", 50, 0)  # a failed run keeps everything for a look
    assert failed["rc"] == 1 and (run / "exp" / "model.pt").exists() and not (run / "cell.json").exists()
    first = scored_cell(["true"], run, "a", 50, 0)
    assert first["rc"] == 0 and first["relative_reduction"] == pytest.approx(0.5)
    assert not list((run / "exp").glob("model.pt*"))
    assert (run / "exp" / "decode_test" / "result.json").is_file()
    # A rerun of the bench reads the cell back: the command (which would fail now) is not run again.
    assert scored_cell(["false"], run, "a", 50, 0) == first
