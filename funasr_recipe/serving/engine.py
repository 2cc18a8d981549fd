"""Decoding for the HTTP service: waveform pieces in, texts with tags and token timestamps out, on the
recipe's one ONNX runtime (runtime/onnx_asr.py: the same features, graph and decoding rule that stage
4's parity check and stage 5's benchmark run). Reads the export dir through OnnxASR; writes nothing.

Timestamps come from the greedy CTC path: a token spans the run of output frames where it is the best
class. SenseVoiceSmall's first 4 output frames answer its prompt (language, emotion, event, text
normalisation) and hold no audio; each later frame covers ``lfr_n`` fbank shifts (60 ms). Families
that subsample further (Conformer-CTC) cover proportionally more per frame. Paraformer predicts tokens
without an alignment: its tokens carry no times.

  engine = Engine(OnnxASR("exp/tiny_sensevoice/export"))
  engine.decode([Piece(wave, offset=0.0)])  # -> [PieceResult(text="seven", tags={...}, tokens=[...])]
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from funasr_recipe.data.tags import TAG, split_tags
from funasr_recipe.families.registry import family_spec
from funasr_recipe.runtime.onnx_asr import NO_OUTPUT, OnnxASR
from funasr_recipe.runtime.onnx_session import ctc_spans


@dataclass(frozen=True)
class Piece:
    """Mono float32 audio at the model's rate, ``offset`` seconds into the request's audio."""

    wave: np.ndarray
    offset: float = 0.0
    language: str = "auto"
    textnorm: str = "woitn"

    @property
    def samples(self) -> int:
        return len(self.wave)


@dataclass
class Token:
    token: str  # the vocabulary entry, "▁" kept (it marks the start of a word)
    start: float | None  # seconds in the request's audio; None where the family has no alignment
    end: float | None


@dataclass
class PieceResult:
    text: str
    tags: dict[str, str] = field(default_factory=dict)  # language/emotion/event/itn -> name
    tokens: list[Token] = field(default_factory=list)


class Engine:
    """Batches of pieces -> results, on one OnnxASR. Not thread-safe: one batcher thread calls it."""

    def __init__(self, asr: OnnxASR) -> None:
        self.asr = asr
        self.family = asr.family
        self.spec = family_spec(self.family)
        self.fs = asr.fs
        self.prompt = self.spec.prompt_frames  # output frames that answer the prompt, before the audio's
        conf = asr.fbank_conf
        self.lfr_s = conf.lfr_n * conf.frame_shift / 1000.0
        self.ctc = self.spec.ctc

    @property
    def languages(self) -> tuple[str, ...]:
        """Values the ``language`` option takes: SenseVoice's prompt languages, else only "auto"."""
        return tuple(self.spec.language_ids) or ("auto",)

    def _extra(self, pieces: list[Piece]) -> dict[str, np.ndarray] | None:
        if not self.spec.extra_inputs:
            return None
        prompts = [self.spec.prompt(p.language, p.textnorm) for p in pieces]
        return {name: np.array([p[name] for p in prompts], dtype=np.int32) for name in self.spec.extra_inputs}

    def decode(self, pieces: list[Piece]) -> list[PieceResult]:
        """One onnxruntime call for the batch; a batch the graph rejects (a piece too short for it) is
        decoded piece by piece, and a piece too short on its own gets an empty text, as funasr gives."""
        if not pieces:
            return []
        feats = self.asr.features([p.wave for p in pieces])
        try:
            scores, lens = self.asr.infer(feats, self._extra(pieces))
        except NO_OUTPUT:
            if len(pieces) == 1:
                return [PieceResult("")]
            return [r for p in pieces for r in self.decode([p])]
        best = scores.argmax(axis=-1)
        return [self._result(p, b[:n], f.shape[0])
                for p, b, n, f in zip(pieces, best, lens.tolist(), feats, strict=True)]

    def _result(self, piece: Piece, best: np.ndarray, lfr_frames: int) -> PieceResult:
        ids = self.asr.parts.token_ids(best)
        tags, text = split_tags(self.asr.detokenize(ids))
        if not self.ctc:
            return PieceResult(text, tags, [Token(self.asr.detokenize.piece(i), None, None) for i in ids])
        audio_frames = max(1, len(best) - self.prompt)
        # Seconds per output frame: lfr_n fbank shifts, times the family's own subsampling.
        frame_s = self.lfr_s * lfr_frames / audio_frames
        duration = piece.samples / self.fs
        tokens = []
        for token, first, end in ctc_spans(best, self.asr.parts.blank_id):
            name = self.asr.detokenize.piece(token)
            if first < self.prompt or TAG.fullmatch(name):
                continue  # the prompt's answers are the tags, not words in time
            start = min(duration, (first - self.prompt) * frame_s)
            stop = min(duration, (end - self.prompt) * frame_s)
            tokens.append(Token(name, round(piece.offset + start, 3), round(piece.offset + stop, 3)))
        return PieceResult(text, tags, tokens)
