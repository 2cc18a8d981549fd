"""Every conf/*.yaml shrunk to a CPU size (TINY) and a random batch for it; the resolved config, its model
and frontend are funasr_recipe/model/architecture.py's."""

from __future__ import annotations

from pathlib import Path

import torch
from omegaconf import DictConfig

from funasr_recipe.model.tokenizer import SENSEVOICE_TAG_IDS

ROOT = Path(__file__).resolve().parents[2]


TINY = {
    "encoder_conf": {"output_size": 64, "attention_heads": 2, "linear_units": 128, "num_blocks": 2,
                     "tp_blocks": 1, "cnn_module_kernel": 7},
    "decoder_conf": {"attention_heads": 2, "linear_units": 128, "num_blocks": 1, "att_layer_num": 1},
    "predictor_conf": {"idim": 64},
}


# SenseVoice's prompt: <|en|> <|NEUTRAL|> <|Speech|> <|woitn|>, in SenseVoiceCTCDataset's order.
SENSEVOICE_PROMPT = [SENSEVOICE_TAG_IDS[t] for t in ("<|en|>", "<|NEUTRAL|>", "<|Speech|>", "<|woitn|>")]


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
