"""A tiny SenseVoiceSmall built in-process, for the adapter and checkpoint tests."""

from __future__ import annotations

from pathlib import Path

import torch
from omegaconf import OmegaConf

from tests.helpers.configs import TINY

ROOT = Path(__file__).resolve().parents[2]


def tiny_sensevoice(seed: int = 0) -> torch.nn.Module:
    """The unmodified SenseVoiceSmall class with conf/tiny_sensevoice.yaml's modules at TINY widths."""
    import funasr.models.sense_voice.model  # noqa: F401  (registers SenseVoiceSmall)
    from funasr.register import tables

    cfg = OmegaConf.load(ROOT / "conf" / "tiny_sensevoice.yaml")
    encoder_conf = {**OmegaConf.to_container(cfg.encoder_conf),
                    **{k: v for k, v in TINY["encoder_conf"].items() if k in cfg.encoder_conf}}
    torch.manual_seed(seed)
    return tables.model_classes["SenseVoiceSmall"](encoder=cfg.encoder, encoder_conf=encoder_conf,
                                                   input_size=560, vocab_size=25055,
                                                   **OmegaConf.to_container(cfg.model_conf)).eval()
