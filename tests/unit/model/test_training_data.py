"""What a model dir records of its training set, and what a fine-tune of it may replay by default."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from funasr_recipe.model.model_dir import recorded_training_data, training_data
from funasr_recipe.model.provenance import TRAIN_IDENTITY


def _identity(exp: Path, data_dir: str, train_set: str) -> None:
    exp.mkdir(parents=True)
    (exp / TRAIN_IDENTITY).write_text(json.dumps({"option.data-dir": json.dumps(data_dir),
                                                  "option.train-set": json.dumps(train_set)}))


def test_the_training_set_comes_from_stage_2s_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "data" / "train").mkdir(parents=True)
    _identity(tmp_path / "exp", "data", "train")
    monkeypatch.chdir(tmp_path)  # a relative --data-dir is the recipe root's, where stages run
    assert training_data(tmp_path / "exp") == tmp_path / "data" / "train"
    _identity(tmp_path / "gone", "data", "nothere")
    assert training_data(tmp_path / "gone") is None
    assert training_data(tmp_path / "nowhere") is None  # no record: a run from before it


def test_a_model_dir_offers_its_training_set_only_while_it_exists(tmp_path: Path) -> None:
    data = tmp_path / "train"
    data.mkdir()
    model = tmp_path / "model"
    model.mkdir()
    (model / "configuration.json").write_text(json.dumps({"recipe": {"train_data": str(data)}}))
    assert recorded_training_data(model) is None  # no wav.scp: not a stage-0 set
    (data / "wav.scp").write_text("a /a.wav\n")
    assert recorded_training_data(model) == data
    (model / "configuration.json").write_text(json.dumps({"framework": "pytorch"}))  # a hub model
    assert recorded_training_data(model) is None
    (model / "configuration.json").write_text("[1, 2")
    assert recorded_training_data(model) is None
