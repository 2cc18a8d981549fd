"""The network a model config describes, built as funasr's ``AutoModel.build_model`` builds it, without the
hub: for the config dry-runs (tests/unit/model/test_configs.py), the GPU check's random-weight model dir
(bench/gpu/random_model_dir.py) and the parameter count of the communication budget (bench/bench_comm.py).

A fine-tuning config (``pretrained_model`` set, no ``model_conf``) names no architecture: funasr merges
it over the released model's config.yaml, whose parts that matter model/released.py records, and the output
layer is as wide as the released vocabulary. A from-scratch config's output layer is its
``build_tokenizer`` vocabulary. ``device="meta"`` allocates no weights: a parameter count in seconds.

Reads conf/*.yaml (+ overrides) and funasr_recipe/model/released_configs/; writes nothing.

  cfg, vocab_size = resolved(Path("conf/sensevoice_small.yaml"))
  print(parameter_count(build_model(cfg, vocab_size, device="meta")))
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from funasr_recipe.core.rejections import BadInputError
from funasr_recipe.model.config import load_config, pretrained_model, tokenizer_spec
from funasr_recipe.model.released import VOCAB_SIZE, released_config
from funasr_recipe.model.tokenizer import SENSEVOICE_VOCAB_SIZE


def resolved(path: Path, overrides: list[str] | None = None) -> tuple[DictConfig, int]:
    """The config as funasr's trainer sees it (merged over the released one when fine-tuning), and the
    vocabulary size of its output layer."""
    cfg = load_config(path, overrides)
    if pretrained_model(cfg):
        if cfg.get("model") not in VOCAB_SIZE:
            raise BadInputError(f"{path}: fine-tunes {cfg.get('model')}, whose released architecture the "
                                f"recipe does not record (it has {', '.join(sorted(VOCAB_SIZE))})")
        # As train_ds.main_hydra decides: without model_conf, funasr's download_model merges the recipe
        # config over the released config.yaml.
        if "model_conf" not in cfg:
            cfg = OmegaConf.merge(released_config(cfg.model), cfg)
        return cfg, VOCAB_SIZE[cfg.model]
    spec = tokenizer_spec(cfg)
    if spec is None:
        raise BadInputError(f"{path}: a from-scratch config needs a build_tokenizer section (its vocabulary "
                            "sizes the output layer)")
    return cfg, SENSEVOICE_VOCAB_SIZE if spec["kind"] == "sensevoice" else int(spec["vocab_size"])


def frontend_of(cfg: DictConfig) -> Any:
    """The config's frontend (funasr's class), without CMVN: stage 1's am.mvn or the released one."""
    from funasr.register import tables

    conf = OmegaConf.to_container(cfg.frontend_conf, resolve=True)
    conf["cmvn_file"] = None
    return tables.frontend_classes.get(cfg.frontend)(**conf)


def build_model(cfg: DictConfig, vocab_size: int, device: str = "cpu") -> torch.nn.Module:
    """The network of ``cfg``, randomly initialised, as ``AutoModel.build_model`` builds it: the frontend
    gives the input size and ``vocab_size`` the output size; ``device="meta"`` allocates no weights."""
    from funasr.register import tables
    from funasr.utils.misc import deep_update

    from funasr_recipe.model.trainer import register_recipe_classes

    register_recipe_classes()  # ConformerCTC is the recipe's own
    model_class = tables.model_classes.get(cfg.model)
    if model_class is None:
        raise BadInputError(f"model {cfg.model} is not registered with funasr")
    kwargs = OmegaConf.to_container(cfg, resolve=True)
    with torch.device(device):
        frontend = frontend_of(cfg)
        kwargs.update(frontend=frontend, input_size=frontend.output_size(), vocab_size=vocab_size)
        model_conf: dict[str, Any] = {}
        deep_update(model_conf, kwargs.get("model_conf", {}))
        deep_update(model_conf, kwargs)
        return model_class(**model_conf)


def parameter_count(model: torch.nn.Module) -> int:
    """Every parameter of ``model``, trainable or not."""
    return sum(p.numel() for p in model.parameters())
