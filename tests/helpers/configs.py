"""Every conf/*.yaml shrunk to a CPU size: the resolved config, its model and frontend, a random batch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from funasr.register import tables
from funasr.utils.misc import deep_update
from omegaconf import DictConfig, OmegaConf

from funasr_recipe.model.config import load_config, pretrained_model, tokenizer_spec
from funasr_recipe.model.released import VOCAB_SIZE, released_config
from funasr_recipe.model.tokenizer import SENSEVOICE_TAG_IDS, SENSEVOICE_VOCAB_SIZE

ROOT = Path(__file__).resolve().parents[2]


TINY = {
    "encoder_conf": {"output_size": 64, "attention_heads": 2, "linear_units": 128, "num_blocks": 2,
                     "tp_blocks": 1, "cnn_module_kernel": 7},
    "decoder_conf": {"attention_heads": 2, "linear_units": 128, "num_blocks": 1, "att_layer_num": 1},
    "predictor_conf": {"idim": 64},
}


# SenseVoice's prompt: <|en|> <|NEUTRAL|> <|Speech|> <|woitn|>, in SenseVoiceCTCDataset's order.
SENSEVOICE_PROMPT = [SENSEVOICE_TAG_IDS[t] for t in ("<|en|>", "<|NEUTRAL|>", "<|Speech|>", "<|woitn|>")]


def resolved(path: Path) -> tuple[DictConfig, int]:
    """The config as funasr's trainer sees it (merged over the released one when fine-tuning), and
    the vocabulary size of its output layer."""
    cfg = load_config(path)
    if pretrained_model(cfg):
        # funasr's download_model: the released config.yaml, with the recipe config merged over it.
        return OmegaConf.merge(released_config(cfg.model), cfg), VOCAB_SIZE[cfg.model]
    spec = tokenizer_spec(cfg)
    assert spec is not None, f"{path.name}: a from-scratch config needs build_tokenizer"
    return cfg, SENSEVOICE_VOCAB_SIZE if spec["kind"] == "sensevoice" else int(spec["vocab_size"])


def frontend_of(cfg: DictConfig) -> Any:
    conf = OmegaConf.to_container(cfg.frontend_conf, resolve=True)
    conf["cmvn_file"] = None  # stage 1's am.mvn or the released one; either way not here
    return tables.frontend_classes.get(cfg.frontend)(**conf)


def build_model(cfg: DictConfig, vocab_size: int) -> torch.nn.Module:
    """The model as ``funasr.auto.auto_model.AutoModel.build_model`` builds it (without the hub)."""
    model_class = tables.model_classes.get(cfg.model)
    assert model_class is not None, f"model {cfg.model} is not registered with funasr"
    kwargs = OmegaConf.to_container(cfg, resolve=True)
    frontend = frontend_of(cfg)
    kwargs.update(frontend=frontend, input_size=frontend.output_size(), vocab_size=vocab_size)
    model_conf: dict[str, Any] = {}
    deep_update(model_conf, kwargs.get("model_conf", {}))
    deep_update(model_conf, kwargs)
    return model_class(**model_conf)


def random_batch(cfg: DictConfig, input_size: int, vocab_size: int) -> dict[str, torch.Tensor]:
    """Two utterances of random model input (already LFR-stacked) with targets laid out as the
    config's dataset lays them out, padded as funasr's collators pad (features 0, ids -1)."""
    gen = torch.Generator().manual_seed(0)
    frames, n_tokens = [48, 36], [5, 3]
    speech = torch.zeros(2, max(frames), input_size)
    text = torch.full((2, max(n_tokens) + (4 if cfg.model == "SenseVoiceSmall" else 0)), -1, dtype=torch.long)
    lengths = []
    for i, (t, n) in enumerate(zip(frames, n_tokens, strict=True)):
        speech[i, :t] = torch.randn(t, input_size, generator=gen)
        ids = torch.randint(4, min(vocab_size, SENSEVOICE_PROMPT[0]), (n,), generator=gen).tolist()
        if cfg.model == "SenseVoiceSmall":
            ids = SENSEVOICE_PROMPT + ids
        text[i, :len(ids)] = torch.tensor(ids)
        lengths.append(len(ids))
    # Lengths as (B, 1) int32: what the collators make of each sample's 1-element length tensor.
    return {"speech": speech, "speech_lengths": torch.tensor(frames, dtype=torch.int32)[:, None],
            "text": text, "text_lengths": torch.tensor(lengths, dtype=torch.int32)[:, None]}
