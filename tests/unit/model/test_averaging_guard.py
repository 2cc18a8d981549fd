"""Stage 3's guard against a useless average (issue #30): checkpoints far from the best are left out, the
average is checked against the best checkpoint on the validation set and final falls back to the best,
the count comes from the overrides after --, and funasr's own model.pt.avg<n> goes.

Reads conf/tiny_sensevoice.yaml and a few bundled digit clips (the checked cases, on a tiny random-init
SenseVoiceSmall: tests/helpers/model_dirs.py); writes under tmp paths.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from funasr_recipe.model.averaging import average_wins, finalize, leave_out_far
from funasr_recipe.model.checkpoint import safe_load
from funasr_recipe.model.model_dir import load_automodel
from funasr_recipe.model.validation_loss import SEED, ValidationLoss, valid_set
from local.average import main
from tests.helpers.make_bad_kaldi_dir import DEFAULT_WAV_DIR
from tests.helpers.model_dirs import WORDS, build_model_dir

# The issue's 4-epoch run, as funasr recorded it.
ISSUE = {"model.pt.ep1": 19.85, "model.pt.ep2": 2.88, "model.pt.ep3": 1.85, "model.pt.ep4": 0.652}


def toy_run(exp: Path, losses: dict[str, float], avg_nbest_model: int = 5) -> dict[str, dict]:
    """A ddp-style exp dir of toy checkpoints (no validation set in its config), with funasr's
    end-of-training model.pt.avg<avg_nbest_model> beside them; returns each checkpoint's weights."""
    exp.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(0)
    weights = {}
    for name in losses:
        weights[name] = {"w": torch.randn(3, 4, generator=gen), "b": torch.randn(4, generator=gen)}
        torch.save({"state_dict": weights[name]}, exp / name)
    torch.save({"state_dict": weights[name], "saved_ckpts": losses, "avg_keep_nbest_models_type": "loss"},
               exp / "model.pt")
    torch.save({"state_dict": weights[name]}, exp / f"model.pt.avg{avg_nbest_model}")  # funasr's
    OmegaConf.save(OmegaConf.create({"model": "Toy", "train_conf": {"avg_nbest_model": avg_nbest_model}}),
                   exp / "config.yaml")
    return weights


def recipe(final: Path) -> dict:
    return json.loads((final / "configuration.json").read_text())["recipe"]


def test_checkpoints_far_above_the_best_are_left_out_and_said_why() -> None:
    kept, left_out = leave_out_far(ISSUE, sorted(ISSUE, key=ISSUE.get))
    assert kept == ["model.pt.ep4"]
    assert set(left_out) == {"model.pt.ep1", "model.pt.ep2", "model.pt.ep3"}
    assert "19.85 is more than 100% above the best's (model.pt.ep4: 0.652" in left_out["model.pt.ep1"]
    # The limit is best + margin * |best|, inclusive; a non-finite record is always out.
    losses = {"a": 1.0, "b": 2.0, "c": 2.01, "d": math.inf, "e": math.nan}
    assert leave_out_far(losses, list(losses))[0] == ["a", "b"]
    assert leave_out_far(losses, list(losses), margin=0.5)[0] == ["a"]
    assert leave_out_far({"a": -2.0, "b": -1.0}, ["a", "b"], margin=0.5)[0] == ["a", "b"]


def test_the_issues_run_is_final_from_its_best_epoch_and_funasrs_average_goes(tmp_path: Path) -> None:
    weights = toy_run(tmp_path, ISSUE)
    assert main(["--exp-dir", str(tmp_path)]) == 0
    card = recipe(tmp_path / "final")
    assert card["checkpoint"] == "model.pt.ep4"  # not an average of all four, epoch 1 included
    assert set(card["left_out"]) == {"model.pt.ep1", "model.pt.ep2", "model.pt.ep3"}
    assert torch.equal(safe_load(tmp_path / "final" / "model.pt")["w"], weights["model.pt.ep4"]["w"])
    assert not list(tmp_path.glob("model.pt.avg*"))  # funasr's model.pt.avg5 (of 4) is no result


def test_the_overrides_after_dashes_set_the_count(tmp_path: Path) -> None:
    losses = {"model.pt.ep1": 1.0, "model.pt.ep2": 1.1, "model.pt.ep3": 1.2}
    toy_run(tmp_path, losses, avg_nbest_model=3)
    assert main(["--exp-dir", str(tmp_path), "--", "++dataset_conf.batch_size=10",
                 "++train_conf.avg_nbest_model=1"]) == 0
    assert recipe(tmp_path / "final")["checkpoint"] == "model.pt.ep1"
    assert main(["--exp-dir", str(tmp_path), "--num", "2", "--", "++train_conf.avg_nbest_model=1"]) == 0
    assert recipe(tmp_path / "final")["checkpoint"] == "model.pt.avg2"  # --num wins
    assert main(["--exp-dir", str(tmp_path), "--"]) == 0
    assert recipe(tmp_path / "final")["checkpoint"] == "model.pt.avg3"  # config.yaml's
    assert [p.name for p in tmp_path.glob("model.pt.avg*")] == ["model.pt.avg3"]  # the earlier avg2 went
    assert main(["--exp-dir", str(tmp_path), "--", "train_conf.avg_nbest_model=zero"]) == 2


def test_the_decision_never_takes_a_worse_average() -> None:
    assert average_wins(0.29, 0.33) and average_wins(0.33, 0.33)
    assert not average_wins(0.34, 0.33)
    assert not average_wins(math.nan, 0.33) and not average_wins(math.inf, 0.33)
    assert average_wins(0.5, math.inf)


@pytest.fixture(scope="module")
def tiny_exp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-init SenseVoiceSmall run: config.yaml with a 6-utterance validation set of raw
    digit clips (one batch), and its random-init weights as exp/model.pt."""
    wavs = sorted(DEFAULT_WAV_DIR.glob("*.wav"))[::300][:6]
    if len(wavs) < 6:
        pytest.skip(f"{DEFAULT_WAV_DIR}: the bundled corpus is missing")
    root = tmp_path_factory.mktemp("guard")
    data = root / "dev.jsonl"
    data.write_text("".join(json.dumps({"key": w.stem, "source": str(w), "source_len": 100,
                                        "target": WORDS[int(w.stem[0])], "text_language": "<|en|>"}) + "\n"
                            for w in wavs))
    build_model_dir(root, "SenseVoiceSmall", data)
    cfg = OmegaConf.load(root / "exp" / "config.yaml")
    cfg.valid_data_set_list = str(data)
    cfg.dataset_conf.num_workers = 0
    cfg.dataset_conf.batch_size = 250  # frames, 100 an utterance: three batches of two
    OmegaConf.save(cfg, root / "exp" / "config.yaml")
    return root / "exp"


def sharpened(base: dict[str, torch.Tensor], scale: float) -> dict[str, torch.Tensor]:
    """``base`` with its output layer scaled: random logits made confident, so a higher loss."""
    out = dict(base)
    out["ctc.ctc_lo.weight"] = base["ctc.ctc_lo.weight"] * scale
    return out


def checked_run(tiny_exp: Path, exp: Path, checkpoints: dict[str, tuple[float, float]]) -> dict:
    """``exp``: ``tiny_exp``'s config and, per name, its weights with the output layer scaled and a
    recorded loss (name -> (scale, loss)); returns the weights."""
    exp.mkdir()
    (exp / "config.yaml").write_text((tiny_exp / "config.yaml").read_text())
    base = safe_load(tiny_exp / "model.pt")
    weights = {name: sharpened(base, scale) for name, (scale, _) in checkpoints.items()}
    for name, state in weights.items():
        torch.save({"state_dict": state}, exp / name)
    torch.save({"saved_ckpts": {n: loss for n, (_, loss) in checkpoints.items()},
                "avg_keep_nbest_models_type": "loss"}, exp / "model.pt")
    return weights


def test_a_worse_average_falls_back_to_the_best_checkpoint(tiny_exp: Path, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture) -> None:
    """The best checkpoint by record is the plain random init; the other, close behind in the record,
    has a 40 times sharper output layer, and so has their average (20.5): worse than the best."""
    exp = tmp_path / "exp"
    weights = checked_run(tiny_exp, exp, {"model.pt.ep1": (40.0, 1.5), "model.pt.ep2": (1.0, 1.0)})
    assert main(["--exp-dir", str(exp), "--num", "2"]) == 0
    out, err = capsys.readouterr()
    card = recipe(exp / "final")
    assert card["checkpoint"] == json.loads(out.splitlines()[-1])["checkpoint"] == "model.pt.ep2"
    losses = card["validation"]["losses"]
    assert card["validation"]["chosen"] == "model.pt.ep2" and set(losses) == {"model.pt.avg2", "model.pt.ep2"}
    assert losses["model.pt.avg2"] > losses["model.pt.ep2"]
    assert card["averaged"] == {"model.pt.ep2": 1.0, "model.pt.ep1": 1.5}
    final = safe_load(exp / "final" / "model.pt")
    assert torch.equal(final["ctc.ctc_lo.weight"], weights["model.pt.ep2"]["ctc.ctc_lo.weight"])
    assert "final is the best checkpoint model.pt.ep2, not the average model.pt.avg2" in err
    assert "validation loss of model.pt.avg2 on" in err  # with progress


def test_a_better_average_is_final(tiny_exp: Path, tmp_path: Path) -> None:
    """Output layers scaled by +40 and -40: their average's is 0 (uniform logits), far better than either."""
    exp = tmp_path / "exp"
    checked_run(tiny_exp, exp, {"model.pt.ep1": (40.0, 1.0), "model.pt.ep2": (-40.0, 1.2)})
    outcome = finalize(exp, 5, exp / "final")
    card = recipe(exp / "final")
    assert outcome.checkpoint == card["checkpoint"] == card["validation"]["chosen"] == "model.pt.avg2"
    losses = card["validation"]["losses"]
    assert losses["model.pt.avg2"] < losses["model.pt.ep1"]
    assert torch.count_nonzero(safe_load(exp / "final" / "model.pt")["ctc.ctc_lo.weight"]) == 0


def test_the_validation_loss_is_funasrs_on_its_validation_loader(tiny_exp: Path) -> None:
    """The loss of ValidationLoss is the batch mean of the model's loss over the loader funasr's trainer
    validates with (DataloaderMapStyle.build_iter), the model in eval mode, from the same seed: the same
    twice (SenseVoiceSmall draws its language query even in eval mode)."""
    from funasr.register import tables

    final = tiny_exp.parent / "final"
    scorer = ValidationLoss(final, valid_set(tiny_exp))
    state = safe_load(final / "model.pt")
    scorer.model.train()
    got = scorer(state, "init")
    assert not scorer.model.training
    assert scorer(state, "init again") == got

    automodel = load_automodel(final)
    kwargs = {**OmegaConf.to_container(OmegaConf.load(tiny_exp / "config.yaml")),
              "frontend": automodel.kwargs["frontend"], "tokenizer": automodel.kwargs["tokenizer"]}
    kwargs["train_data_set_list"] = kwargs["valid_data_set_list"]
    _, loader = tables.dataloader_classes.get("DataloaderMapStyle")(**kwargs).build_iter(epoch=0)
    model = automodel.model.eval()
    torch.manual_seed(SEED)
    with torch.no_grad():
        losses = [float(model(**batch)[0]) for batch in loader]
    assert len(losses) > 1
    assert got == pytest.approx(sum(losses) / len(losses), rel=1e-5)
    scorer.close()


def test_final_records_the_run_that_made_it(tmp_path: Path) -> None:
    """final/configuration.json names the run's config, the model it fine-tuned and that model's origin
    (model/provenance.py), so that results and the model card name what was trained."""
    hub_copy = tmp_path / "SenseVoiceSmall"
    hub_copy.mkdir()
    hub = {"model_name_in_hub": {"ms": "iic/SenseVoiceSmall"}}
    (hub_copy / "configuration.json").write_text(json.dumps(hub))
    exp = tmp_path / "exp"
    toy_run(exp, {"model.pt.ep1": 1.0, "model.pt.ep2": 5.0})
    options = {"config": "conf/sensevoice_small.yaml", "pretrained-dir": str(hub_copy), "exp-dir": "exp"}
    identity = {f"given.{k}": json.dumps(v) for k, v in options.items()}  # local.marker resume's record
    (exp / "train_identity.json").write_text(json.dumps(identity))
    assert main(["--exp-dir", str(exp)]) == 0
    card = recipe(exp / "final")
    assert (card["config"], card["pretrained"], card["model"]) == \
        ("conf/sensevoice_small.yaml", str(hub_copy), "iic/SenseVoiceSmall")
    from funasr_recipe.model.provenance import model_label

    assert model_label(exp / "final") == f"iic/SenseVoiceSmall fine-tuned from {hub_copy}, epoch 1 checkpoint"
