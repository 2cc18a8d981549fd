"""Read a recipe model config (conf/*.yaml, Hydra/funasr format) plus command-line overrides.

Stage programs need a few facts from it before funasr sees it: the frontend parameters (stage 1
computes the same fbank as the model's ``WavFrontend``), which tokenizer to build for a from-scratch
model, and whether the model starts from a pretrained one (whose ``am.mvn`` and tokenizer are kept).

Recipe-only keys, which funasr ignores:
  ``build_tokenizer: {kind, vocab_size, sp_type}``  a from-scratch model's tokenizer (stage 1 builds it)
  ``pretrained_model: <hub name or dir>``           fine-tune this model (stage 2 resolves it)
  ``feats_storage: float32 | uint16``               how stage 1 stores the features (features/storage.py)
  ``feats_augment: {reverb_prob, noise_prob, ...}``  stage 1's augmentation of the training set
                                                     (features/augment.py)
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from omegaconf import DictConfig, OmegaConf

from funasr_recipe.core.rejections import BadInputError

if TYPE_CHECKING:  # features/fbank.py imports torch (2 s), which local/resolve_model.py has no use for
    from funasr_recipe.features.augment import AugmentConf
    from funasr_recipe.features.fbank_conf import FbankConf


def load_config(path: Path, overrides: list[str] | None = None) -> DictConfig:
    """The YAML at ``path`` with Hydra-style overrides (``++a.b=v``, ``+a.b=v``, ``a.b=v``) applied."""
    if not path.is_file():
        raise FileNotFoundError(f"model config not found: {path}")
    cfg = OmegaConf.load(path)
    dotlist = [o.lstrip("+") for o in overrides or [] if not o.startswith("~")]
    if dotlist:
        cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(dotlist))
    return cfg


def fbank_conf(cfg: DictConfig) -> FbankConf:
    """The frontend parameters; only ``WavFrontend`` (what SenseVoice, Paraformer and ours use) is known."""
    from funasr_recipe.features.fbank_conf import FbankConf

    frontend = cfg.get("frontend", "WavFrontend")
    if frontend not in ("WavFrontend", "wav_frontend"):
        raise BadInputError(f"frontend '{frontend}': stage 1 computes features for WavFrontend only; "
                            "use --feats-type raw for other frontends")
    return FbankConf.from_frontend_conf(OmegaConf.to_container(cfg.get("frontend_conf") or {}, resolve=True))


def pretrained_model(cfg: DictConfig) -> str | None:
    """Hub name or directory of the model to fine-tune, or None for a from-scratch model."""
    value = cfg.get("pretrained_model")
    return str(value) if value else None


def tokenizer_spec(cfg: DictConfig) -> dict | None:
    """``build_tokenizer`` of a from-scratch config, or None when the pretrained model brings one."""
    if pretrained_model(cfg):
        return None
    spec = cfg.get("build_tokenizer")
    return None if spec is None else OmegaConf.to_container(spec, resolve=True)


def feats_storage(cfg: DictConfig) -> str:
    """How stage 1 stores the features: ``feats_storage`` (default float32); BadInputError for any other
    value."""
    from funasr_recipe.features.storage import DEFAULT, check_storage

    return check_storage(cfg.get("feats_storage", DEFAULT), "feats_storage")


def feats_augment(cfg: DictConfig) -> AugmentConf:
    """Stage 1's augmentation of the training set: ``feats_augment`` (default off); BadInputError for a
    key or value features/augment.py does not know."""
    from funasr_recipe.features.augment import AugmentConf

    spec = cfg.get("feats_augment")
    return AugmentConf.from_config(OmegaConf.to_container(spec, resolve=True) if isinstance(spec, DictConfig)
                                   else spec)


def funasr_config(cfg: DictConfig, pretrained_dir: Path | None = None) -> dict:
    """The config funasr's trainer ends up with, as a dict. For a fine-tune given its local model dir, and
    a config without ``model_conf`` (as train_ds.main_hydra decides), that is the model dir's config.yaml
    with the dir's files resolved (configuration.json's file_path_metas: tokenizer, am.mvn) and ours merged
    over it: funasr's own download_model, which reads a local dir without going to the hub."""
    ours = OmegaConf.to_container(cfg, resolve=True)
    if pretrained_dir is None or "model_conf" in ours:
        return ours
    from funasr.download.download_model_from_hub import download_model

    logging.disable(logging.WARNING)  # its "trust_remote_code: False" on the root logger is no warning
    try:
        return download_model(**{**ours, "model": str(pretrained_dir), "is_training": True})
    finally:
        logging.disable(logging.NOTSET)
