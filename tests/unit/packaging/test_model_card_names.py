"""The model card names the model by what was trained (model/provenance.py), not by the exp dir's name."""

from __future__ import annotations

import json
from pathlib import Path

from funasr_recipe.packaging.model_card import CardInputs, model_section
from funasr_recipe.packaging.package import trained_as


def test_the_card_says_what_was_trained_with_which_config(tmp_path: Path) -> None:
    final = tmp_path / "exp" / "final"
    final.mkdir(parents=True)
    record = {"checkpoint": "model.pt.avg3", "config": "conf/sensevoice_small.yaml", "pretrained": "/m/base",
              "model": "tiny_sensevoice.yaml"}
    (final / "configuration.json").write_text(json.dumps({"recipe": record}))
    trained = trained_as(final)
    assert trained == ("tiny_sensevoice.yaml fine-tuned from /m/base, average of 3 checkpoints; "
                       "config `conf/sensevoice_small.yaml`")
    card = CardInputs(tag="exp", family="SenseVoiceSmall", parameters=1000, files={}, triton_models=[],
                      trt={}, export={}, parity={}, trained=trained)
    text = "\n".join(model_section(card))
    assert f"- trained: {trained}" in text and "- package tag: `exp` (the experiment dir's name)" in text
    (final / "configuration.json").write_text(json.dumps({"framework": "pytorch"}))  # not one of ours
    assert trained_as(final) is None
    assert "trained:" not in "\n".join(model_section(CardInputs(
        tag="exp", family="SenseVoiceSmall", parameters=None, files={}, triton_models=[], trt={}, export={},
        parity={})))
