"""The released models' config.yaml, for where the hub cannot be reached: the parts funasr keeps when a
fine-tuning config (``pretrained_model`` set, no architecture of its own) is merged over it, that is the
architecture and the training values the recipe's config must override.

Read by tests/unit/model/test_configs.py (the dry run of every fine-tuning config) and
bench/gpu/random_model_dir.py
(the GPU check's random-weight SenseVoiceSmall): one record of each architecture, not one per reader.

Reads funasr_recipe/model/released_configs/<model>.yaml; writes nothing.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from funasr_recipe.families.registry import FAMILIES

CONFIG_DIR = Path(__file__).with_name("released_configs")
# The output layer's width, which a model dir's tokenizer gives and a config.yaml does not.
VOCAB_SIZE = {s.released: s.released_vocab_size for s in FAMILIES.values() if s.released}


def released_path(model: str) -> Path:
    """The record of ``model``'s (a funasr model class name) released config.yaml."""
    path = CONFIG_DIR / f"{model}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in CONFIG_DIR.glob("*.yaml")))
        raise FileNotFoundError(f"{path}: no released architecture recorded for {model} (known: {known})")
    return path


def released_config(model: str) -> DictConfig:
    return OmegaConf.load(released_path(model))
