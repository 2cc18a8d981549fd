"""model/provenance.py: what a model dir is, named by what was used (hub id, config, pretrained dir,
checkpoint), never by the config's name alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from funasr_recipe.core.rejections import BadInputError
from funasr_recipe.model.provenance import (
    TRAIN_IDENTITY,
    base_model,
    checkpoint_words,
    describe_model_dir,
    model_label,
    provenance,
)


def model_dir(path: Path, configuration: dict | str) -> Path:
    path.mkdir(parents=True)
    text = configuration if isinstance(configuration, str) else json.dumps(configuration)
    (path / "configuration.json").write_text(text)
    return path


def test_a_hub_models_local_copy_is_named_by_its_hub_id(tmp_path: Path) -> None:
    hub = {"model_name_in_hub": {"ms": "iic/SenseVoiceSmall", "hf": ""}}
    local = model_dir(tmp_path / "models" / "sv", hub)
    assert describe_model_dir(local) == f"{local} (a local copy of iic/SenseVoiceSmall)"
    assert base_model(local) == "iic/SenseVoiceSmall"
    assert model_label(local, pretrained=True) == f"pretrained iic/SenseVoiceSmall ({local})"
    plain = model_dir(tmp_path / "plain", {"framework": "pytorch"})  # nothing says what it is
    assert describe_model_dir(plain) == str(plain)
    assert model_label(plain, pretrained=True) == f"pretrained {plain}"


def test_a_fine_tune_of_a_tiny_model_with_another_config_is_named_by_the_tiny_model(tmp_path: Path) -> None:
    """The issue's case: a tiny SenseVoice fine-tuned with conf/sensevoice_small.yaml is no
    "sensevoice_small avg3"."""
    base = model_dir(tmp_path / "fold" / "final", {"recipe": {"checkpoint": "model.pt.avg5",
                                                              "model": "tiny_sensevoice.yaml"}})
    assert model_label(base) == "tiny_sensevoice.yaml from scratch, average of 5 checkpoints"
    exp = tmp_path / "exp"
    exp.mkdir()
    # As local.marker resume records a run: paths by name under given.*, other options under option.*.
    given = {"config": "conf/sensevoice_small.yaml", "pretrained-dir": str(base)}
    identity = {f"given.{k}": json.dumps(v) for k, v in given.items()} | {"option.data-dir": '"data"'}
    (exp / TRAIN_IDENTITY).write_text(json.dumps(identity))
    record = provenance(exp)
    assert record == {"config": "conf/sensevoice_small.yaml", "pretrained": str(base),
                      "model": "tiny_sensevoice.yaml"}
    final = model_dir(exp / "final", {"recipe": {"checkpoint": "model.pt.avg3", **record}})
    label = model_label(final, "sensevoice_small")
    assert label == f"tiny_sensevoice.yaml fine-tuned from {base}, average of 3 checkpoints"
    assert describe_model_dir(final) == f"{final} ({label})"
    assert provenance(tmp_path / "nowhere") == {}  # a run from before stage 2's record


def test_a_model_dir_from_before_the_record_keeps_its_old_name(tmp_path: Path) -> None:
    old = model_dir(tmp_path / "final", {"recipe": {"checkpoint": "model.pt.avg5"}})
    assert model_label(old, "tiny") == "tiny avg5"
    assert describe_model_dir(old) == f"{old} (a model dir of this recipe, average of 5 checkpoints)"
    with pytest.raises(BadInputError, match="no recipe checkpoint"):
        model_label(model_dir(tmp_path / "hub", {"framework": "pytorch"}), "tiny")
    broken = model_dir(tmp_path / "broken", "{oops")
    with pytest.raises(BadInputError, match=f"{broken / 'configuration.json'}:1: not valid JSON"):
        describe_model_dir(broken)


@pytest.mark.parametrize(("name", "words"), [
    ("model.pt.avg3", "average of 3 checkpoints"), ("model.pt.avg1", "average of 1 checkpoint"),
    ("model.pt.ep12", "epoch 12 checkpoint"), ("model.pt.ep0.2000", "epoch 0 step 2000 checkpoint"),
    ("model.pt.best", "best checkpoint"), ("model.pt", "last checkpoint"), ("odd", "checkpoint odd")])
def test_checkpoint_names_in_words(name: str, words: str) -> None:
    assert checkpoint_words(name) == words


def test_the_stage_programs_log_the_dir_they_use_not_the_configs_hub_id(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """run.sh logs "fine-tuning $(local.resolve_model --describe DIR)"; stage 1's merge names the dir too."""
    import argparse

    from omegaconf import OmegaConf

    from local.compute_fbank import _pretrained
    from local.resolve_model import main

    local = model_dir(tmp_path / "sv", {"model_name_in_hub": {"ms": "iic/SenseVoiceSmall"}})
    assert main(["--describe", str(local)]) == 0
    assert capsys.readouterr().out.strip() == f"{local} (a local copy of iic/SenseVoiceSmall)"
    with pytest.raises(SystemExit):  # without --describe, --config is required
        main([])
    cfg = OmegaConf.create({"pretrained_model": "iic/SenseVoiceSmall"})
    assert _pretrained(argparse.Namespace(pretrained_dir=local), cfg) == \
        f"{local} (a local copy of iic/SenseVoiceSmall)"
    assert _pretrained(argparse.Namespace(pretrained_dir=None), cfg) == "iic/SenseVoiceSmall"
