"""Model dirs in the hub's format: written from a training run, recognised, loaded, described.

Reads  <exp-dir>/config.yaml (funasr's resolved config) and a checkpoint of <exp-dir>: a DeepSpeed
       checkpoint dir (its fp32 master weights, through DeepSpeed's zero_to_fp32) or a state-dict file;
       with <exp-dir>/adapter.json, the run's frozen fp32 weights and LoRA adapters (model/adapters.py);
       the am.mvn and tokenizer files the config points at;
writes <out>/{model.pt (fp32 state dict), config.yaml (file names relative to <out>), am.mvn,
       the tokenizer model, tokens.json, configuration.json}: the layout of ModelScope's
       iic/SenseVoiceSmall, so that funasr's AutoModel, funasr's trainer (fine-tuning with
       ``--pretrained-dir <out>``) and the next stages take it like a downloaded model.
``load_automodel`` is the one way the stages open a model dir in PyTorch (funasr's AutoModel, offline,
with the recipe's model and tokenizer classes registered and dither off).

  make_model_dir(Path("exp/tiny_sensevoice"), "model.pt.best", Path("exp/tiny_sensevoice/best_model"))
  model = load_automodel(Path("exp/tiny_sensevoice/final"), device="cpu", threads=2)
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from funasr_recipe.model.provenance import provenance, run_options

log = logging.getLogger(__name__)
# Called with the model dir before AutoModel reads it: compat/lazy_import.install adds the registration of
# the classes the dir's config names, which funasr imported without its __init__ lacks. This layer may not
# import compat (tests/unit/repo/test_style.py), so the lazy import puts itself here.
BEFORE_LOAD: list[Callable[[Path], object]] = []


MODEL_FILES = ("configuration.json", "config.yaml")


def is_model_dir(path: Path) -> bool:
    """A dir with model.pt and configuration.json or config.yaml: a hub model or one of ours."""
    return path.is_dir() and any((path / f).is_file() for f in MODEL_FILES) and (path / "model.pt").exists()


def make_model_dir(exp_dir: Path, checkpoint: str, out: Path, info: dict | None = None) -> Path:
    """Write ``out`` from ``exp_dir``; returns it. configuration.json's "recipe" records the run (its
    config, pretrained dir and base model: model/provenance.py), the checkpoint and ``info``."""
    import torch  # here, not at the top: is_model_dir and the readers need no torch

    from funasr_recipe.model.adapters import finish_state_dict
    from funasr_recipe.model.checkpoint import fp32_state_dict

    cfg = OmegaConf.load(exp_dir / "config.yaml")
    out.mkdir(parents=True, exist_ok=True)
    # A run with frozen parameters or LoRA adapters: its fp32 frozen copies, the adapters merged.
    torch.save(finish_state_dict(exp_dir, fp32_state_dict(exp_dir, checkpoint)), out / "model.pt")
    metas: dict = {"init_param": "model.pt", "config": "config.yaml"}
    cmvn = OmegaConf.select(cfg, "frontend_conf.cmvn_file")
    if cmvn:
        shutil.copyfile(cmvn, out / "am.mvn")
        cfg.frontend_conf.cmvn_file = "am.mvn"
        metas["frontend_conf"] = {"cmvn_file": "am.mvn"}
    bpe = OmegaConf.select(cfg, "tokenizer_conf.bpemodel")
    if bpe:
        shutil.copyfile(bpe, out / Path(bpe).name)
        tokens = Path(bpe).with_name("tokens.json")
        if tokens.is_file():
            shutil.copyfile(tokens, out / "tokens.json")
        cfg.tokenizer_conf.bpemodel = Path(bpe).name
        metas["tokenizer_conf"] = {"bpemodel": Path(bpe).name}
    for key in ("train_data_set_list", "valid_data_set_list", "output_dir", "init_param"):
        cfg.pop(key, None)  # paths of this run, meaningless elsewhere
    cfg.pop("freeze_param", None)  # this run's choice: a fine-tune of the model dir must not inherit it
    OmegaConf.save(cfg, out / "config.yaml")
    configuration = {"framework": "pytorch", "task": "auto-speech-recognition",
                     "model": {"type": "funasr"}, "pipeline": {"type": "funasr-pipeline"},
                     "model_name_in_hub": {"ms": "", "hf": ""}, "file_path_metas": metas,
                     "recipe": {"exp_dir": str(exp_dir.resolve()), "checkpoint": checkpoint,
                                **provenance(exp_dir),
                                **({"train_data": str(data)} if (data := training_data(exp_dir)) else {}),
                                **(info or {})}}
    (out / "configuration.json").write_text(json.dumps(configuration, indent=2) + "\n", encoding="utf-8")
    return out


def training_data(exp_dir: Path) -> Path | None:
    """The stage-0 dir of the training set a run trained on (absolute; relative option values are the
    recipe root's, where the stages run), from stage 2's record; None when unknown or gone."""
    options = run_options(exp_dir)
    if "data-dir" not in options or "train-set" not in options:
        return None
    path = (Path(options["data-dir"]) / options["train-set"]).resolve()
    return path if path.is_dir() else None


def recorded_training_data(model_dir: Path) -> Path | None:
    """The training set a model dir of this recipe says it was trained on (configuration.json's
    "recipe"), when that set is still there: what a fine-tune of it can replay. None for a hub model."""
    try:
        configuration = json.loads((model_dir / "configuration.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    recipe = configuration.get("recipe") if isinstance(configuration, dict) else None
    data = recipe.get("train_data") if isinstance(recipe, dict) else None
    return Path(data) if data and (Path(data) / "wav.scp").is_file() else None


def import_automodel() -> None:
    """Import what ``load_automodel`` needs before it reads a model dir: torch, funasr's AutoModel and the
    recipe's model and tokenizer classes, most of a decode process's start-up (local/decode.py spends it
    while the model is still being averaged)."""
    from funasr import AutoModel  # noqa: F401

    import funasr_recipe.model.conformer_ctc  # noqa: F401  (registers ConformerCTC)
    import funasr_recipe.model.sensevoice_tokenizer  # noqa: F401  (registers SenseVoiceTagTokenizer)


def load_automodel(model_dir: Path, device: str = "cpu", threads: int | None = None) -> Any:
    """funasr's AutoModel on a local model dir (no hub), with the recipe's model and tokenizer classes
    registered and the frontend's dither off."""
    import torch
    from funasr import AutoModel

    import_automodel()

    for before in BEFORE_LOAD:
        before(model_dir)  # funasr's classes its config names, where funasr is imported lazily

    # ncpu: AutoModel otherwise sets 4 torch threads (torch.set_num_threads), whatever the launcher chose.
    model = AutoModel(model=str(model_dir), device=device, disable_update=True, disable_pbar=True,
                      disable_log=True, ncpu=threads or torch.get_num_threads())
    frontend = model.kwargs.get("frontend")
    if getattr(frontend, "dither", 0.0):
        # A model dir without dither: 0.0 (a hub model's) would add random noise to every input: scores
        # would change from run to run, and stage 1's features, which training saw, have none.
        log.info("decoding with the frontend's dither %s set to 0", frontend.dither)
        frontend.dither = 0.0
    return model
