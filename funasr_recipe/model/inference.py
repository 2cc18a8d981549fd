"""A model dir transcribed in PyTorch by funasr's AutoModel, as stage 3 decodes and the benchmark times it.

Reads  a model dir in the hub's layout (model/model_dir.py loads it) and audio files; returns the
texts AutoModel.generate gives (SenseVoice's tags included), in input order. Audio is read and
resampled by the recipe (features/audio.py, features/fbank.py: the training resampler) unless paths
are given to ``transcribe``, in which case funasr reads them itself.

``transcribe_scored`` adds each text's confidence (pseudo-labels, local/pseudo_label.py): the mean, over
the audio frames whose best token is not blank, of that token's CTC log-probability, and the number of
tokens the greedy path emits there. It is read off the model's own greedy CTC decode (SenseVoice,
ConformerCTC) by capturing ``ctc.log_softmax``'s output and the encoder's output lengths; Paraformer
decodes without CTC and gets no score.

  asr = TorchASR(Path("exp/tiny_sensevoice/final"), device="cpu")
  asr.transcribe([asr.wave("a.wav")], ["a"])  # -> ["<|en|><|NEUTRAL|><|Speech|><|woitn|>seven"]
  asr.transcribe_scored([asr.wave("a.wav")], ["a"])  # -> [("<|en|>...seven", -0.05, 1)]
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from funasr_recipe.families.registry import decoding_spec
from funasr_recipe.features.audio import load_audio
from funasr_recipe.features.fbank import resample
from funasr_recipe.model.model_dir import load_automodel

Scored = tuple[str, float | None, int | None]


@contextmanager
def captured_ctc(model: Any) -> Iterator[list[tuple[torch.Tensor, torch.Tensor]]]:
    """While open, every (CTC log-probs (B, T, V), encoder output lengths (B,)) the model's inference
    computes, in call order: its ``ctc.log_softmax`` is wrapped on the instance and its encoder hooked."""
    calls: list[tuple[torch.Tensor, torch.Tensor]] = []
    lengths: list[torch.Tensor] = []
    original = model.ctc.log_softmax

    def log_softmax(x: torch.Tensor) -> torch.Tensor:
        out = original(x)
        calls.append((out, lengths[-1]))  # the same tensor the decode reads, edits (ban_emo_unk) included
        return out

    hook = model.encoder.register_forward_hook(lambda _m, _inp, out: lengths.append(out[1]))
    model.ctc.log_softmax = log_softmax
    try:
        yield calls
    finally:
        del model.ctc.log_softmax  # the class's method again
        hook.remove()


def ctc_scores(log_probs: torch.Tensor, lengths: torch.Tensor, blank_id: int, skip: int = 0,
               ) -> list[tuple[float | None, int]]:
    """(mean log-probability, tokens emitted) per utterance of a batch, over frames ``skip``..length:
    the mean of the best log-probability over the frames whose best token is not blank (None when there
    is none), and the greedy path's tokens (repeats collapsed, blanks dropped)."""
    out = []
    for lp, n in zip(log_probs.float(), lengths.tolist(), strict=True):
        best, ids = lp[skip:n].max(dim=-1)
        emitted = ids != blank_id
        collapsed = torch.unique_consecutive(ids)
        out.append((float(best[emitted].mean()) if emitted.any() else None,
                    int((collapsed != blank_id).sum())))
    return out


class TorchASR:
    """funasr's AutoModel on a model dir: its frontend, its model's own inference (greedy CTC for
    SenseVoice and Conformer-CTC, Paraformer's predictor), language "auto" and no ITN."""

    def __init__(self, model_dir: Path, device: str = "cpu", threads: int | None = None) -> None:
        self.automodel = load_automodel(model_dir, device, threads)
        self.family = type(self.automodel.model).__name__
        self.spec = decoding_spec(self.family)
        self.fs = int(getattr(self.automodel.kwargs.get("frontend"), "fs", 16000))

    @property
    def emits_tags(self) -> bool:
        """Whether the texts carry SenseVoice's language/emotion/event/itn tags."""
        return self.spec.emits_tags

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

    @property
    def scored(self) -> bool:
        """Whether ``transcribe_scored`` gives scores: the model decodes greedy CTC in its inference."""
        model = self.automodel.model
        return self.spec.ctc and hasattr(model, "ctc") and hasattr(model, "encoder")

    def transcribe_scored(self, inputs: list[torch.Tensor] | list[str], keys: list[str],
                          batch_size: int | None = None) -> list[Scored]:
        """(text, mean log-probability, tokens emitted) per input, in input order (module docstring); the
        texts are ``transcribe``'s. Score and count are None for a family without CTC decoding."""
        if not self.scored:
            return [(text, None, None) for text in self.transcribe(inputs, keys, batch_size)]
        model = self.automodel.model
        with captured_ctc(model) as calls:
            texts = self.transcribe(inputs, keys, batch_size)
        # Frames before the audio in the encoder's output (SenseVoice's 4 prompt queries, which emit the
        # tags) are left out of the score: near-certain for every input, they lift a clip of noise to a
        # clean one's level. Measured on the demo model (500 dev clips, 30 of white noise): with them
        # noise averages -0.16 and correctly recognised clips -0.09; without, -0.54 and -0.11, and a
        # threshold of -0.3 keeps 90% of the correct clips, 36% of the misrecognised ones and 3% of the
        # noise.
        skip = self.spec.prompt_frames
        scores = [s for lp, n in calls for s in ctc_scores(lp, n, int(getattr(model, "blank_id", 0)), skip)]
        if len(scores) != len(texts):
            raise RuntimeError(f"captured {len(scores)} CTC outputs for {len(texts)} inputs ({keys[:3]}...)")
        return [(text, lp, n) for text, (lp, n) in zip(texts, scores, strict=True)]
