"""A model dir transcribed in PyTorch by funasr's AutoModel, as stage 3 decodes and the benchmark times it.

Reads  a model dir in the hub's layout (model/model_dir.py loads it) and audio files; returns the
texts AutoModel.generate gives (SenseVoice's tags included), in input order. Audio is read and
resampled by the recipe (features/audio.py, features/fbank.py: the training resampler) unless paths
are given to ``transcribe``, in which case funasr reads them itself.

  asr = TorchASR(Path("exp/tiny_sensevoice/final"), device="cpu")
  asr.transcribe([asr.wave("a.wav")], ["a"])  # -> ["<|en|><|NEUTRAL|><|Speech|><|woitn|>seven"]
"""

from __future__ import annotations

from pathlib import Path

import torch

from funasr_recipe.features.audio import load_audio
from funasr_recipe.features.fbank import resample
from funasr_recipe.model.model_dir import load_automodel


class TorchASR:
    """funasr's AutoModel on a model dir: its frontend, its model's own inference (greedy CTC for
    SenseVoice and Conformer-CTC, Paraformer's predictor), language "auto" and no ITN."""

    def __init__(self, model_dir: Path, device: str = "cpu", threads: int | None = None) -> None:
        self.automodel = load_automodel(model_dir, device, threads)
        self.family = type(self.automodel.model).__name__
        self.fs = int(getattr(self.automodel.kwargs.get("frontend"), "fs", 16000))

    @property
    def emits_tags(self) -> bool:
        """Whether the texts carry SenseVoice's language/emotion/event/itn tags."""
        return self.family == "SenseVoiceSmall"

    def wave(self, source: str) -> torch.Tensor:
        """Mono float audio at the frontend's rate; raises features.audio.AudioError."""
        data, rate = load_audio(source)
        return resample(torch.from_numpy(data.mean(axis=1))[None], rate, self.fs)[0]

    def transcribe(self, inputs: list[torch.Tensor] | list[str], keys: list[str],
                   batch_size: int | None = None) -> list[str]:
        """Texts of waveforms (``wave``) or audio paths, in input order, ``batch_size`` at a time inside
        AutoModel (default: all of them in one batch)."""
        results = self.automodel.generate(input=inputs, key=keys, batch_size=batch_size or len(inputs),
                                          language="auto", use_itn=False, disable_pbar=True)
        if len(results) == len(inputs):
            # In input order: given paths, funasr keys its results by file name, not by our keys.
            return [r.get("text", "") for r in results]
        # Paraformer returns one keyless {"text": ""} for a batch in which it predicts no token at all:
        # find that batch by decoding each on its own.
        size = batch_size or len(inputs)
        if size < len(inputs):
            return [text for i in range(0, len(inputs), size)
                    for text in self.transcribe(inputs[i:i + size], keys[i:i + size])]
        if any(r.get("text") for r in results):
            raise RuntimeError(f"AutoModel.generate returned {len(results)} results for {len(inputs)} "
                               f"inputs ({keys[:3]}...)")
        return [""] * len(inputs)
