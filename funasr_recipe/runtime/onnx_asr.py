"""The recipe's lean ONNX runtime: audio file -> text with an export dir of any family (SenseVoiceSmall,
Paraformer, ConformerCTC), computing the features exactly as the PyTorch model's frontend does.

Reads an export dir written by runtime/export.py (or the onnx/ dir of a stage-5 package): config.yaml
(frontend_conf, model_conf, tokenizer_conf), am.mvn, the sentencepiece model (or tokens.json),
export.json (the family), and model.onnx or model_quant.onnx.

This is the recipe's one ONNX inference path: stage 4's parity check, stage 5's benchmark and package,
and the server all run it. What differs between the families is in one small part each (``Family``):
the graph's extra inputs and how the best token per output frame becomes token ids.

The steps are funasr's WavFrontend + the model's ``inference`` rule, without torch modules or funasr:
audio read with soundfile and resampled with torchaudio's sinc kernel (features/audio.py and
features/numpy_fbank.py: what AutoModel does, so transcripts match it; funasr-onnx resamples with soxr),
Kaldi fbank (features/numpy_fbank.py: numpy alone, so a CPU service installs no torch; stage 4 gates its
difference from the model's own frontend), LFR stacking and
CMVN (features/cmvn.py), one onnxruntime session with a thread per core this process may use, then
greedy CTC (SenseVoiceSmall with language "auto" and no ITN, as stage 3 decodes; ConformerCTC) or the
argmax of each of Paraformer's predicted tokens, and sentencepiece detokenisation. SenseVoice's tags
(``<|en|><|NEUTRAL|><|Speech|><|woitn|>``) are kept in the text, as AutoModel returns them;
``funasr_recipe.data.tags.strip_tags`` removes them.

  from funasr_recipe.runtime.onnx_asr import OnnxASR
  asr = OnnxASR("exp/tiny_sensevoice/export", quantize=True, batch_size=8)
  asr(["a.wav", "b.wav"])  # -> ["<|en|><|NEUTRAL|><|Speech|><|woitn|>seven", ...]
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml
from onnxruntime.capi.onnxruntime_pybind11_state import Fail, InvalidArgument, RuntimeException

from funasr_recipe.core.env import available_cores
from funasr_recipe.families.registry import PARAFORMER, family_spec
from funasr_recipe.features.audio import load_audio
from funasr_recipe.features.cmvn import lfr, read_am_mvn
from funasr_recipe.features.fbank_conf import FbankConf
from funasr_recipe.features.numpy_fbank import NumpyFbank
from funasr_recipe.runtime.char_tokens import join_char_tokens
from funasr_recipe.runtime.onnx_session import collapse_ctc, make_session

log = logging.getLogger(__name__)
# onnxruntime's errors on an input too short for the model (conv subsampling, no predicted token).
NO_OUTPUT = (InvalidArgument, Fail, RuntimeException)


def export_name(export_dir: Path) -> str:
    """The name in an export's metadata (export.json's ``name``, or for an export older than it, its
    ``model_dir``'s), else the export dir's own name."""
    meta = export_dir / "export.json"
    info = json.loads(meta.read_text(encoding="utf-8")) if meta.is_file() else {}
    if info.get("name"):
        return info["name"]
    return served_name(Path(info["model_dir"])) if info.get("model_dir") else export_dir.resolve().name


def export_family(export_dir: Path, config: dict | None = None) -> str:
    """The family of an export dir: export.json's, else config.yaml's ``model``."""
    meta = export_dir / "export.json"
    if meta.is_file():
        family = json.loads(meta.read_text(encoding="utf-8")).get("family")
    else:
        config = config or yaml.safe_load((export_dir / "config.yaml").read_text(encoding="utf-8"))
        family = config.get("model")
    return family_spec(family, str(export_dir)).name


def served_name(model_dir: Path) -> str:
    """The model's name for the services that run its export (export.json's ``name``): its experiment's
    tag (exp/<tag>/final), else the model dir's own name; the export dir may be copied anywhere and
    keep it."""
    model_dir = model_dir.resolve()
    return model_dir.parent.name if model_dir.name == "final" else model_dir.name


@dataclass
class Family:
    """What one model family needs at inference beyond features in, scores out: ConformerCTC's rule,
    greedy CTC over the output frames (repeats collapsed, blank dropped), no extra inputs."""

    name: str
    blank_id: int = 0
    extra: dict[str, int] = field(default_factory=dict)  # per-utterance int32 inputs of the graph

    def inputs(self, batch: int) -> dict[str, np.ndarray]:
        """The graph's inputs besides speech and speech_lengths, for a batch of this size."""
        return {name: np.full(batch, value, dtype=np.int32) for name, value in self.extra.items()}

    def token_ids(self, best: np.ndarray) -> list[int]:
        """Token ids of one utterance's best token per valid output frame."""
        return collapse_ctc(best, self.blank_id)


@dataclass
class ParaformerFamily(Family):
    """Paraformer: one output row per predicted token; its decoder scores <s>, </s> and blank too, and its
    inference drops them."""

    drop: frozenset[int] = frozenset()

    def token_ids(self, best: np.ndarray) -> list[int]:
        return [i for i in best.tolist() if i not in self.drop]


def family_parts(family: str, model_conf: dict, language: str = "auto", textnorm: str = "woitn") -> Family:
    """The ``Family`` of an export, from its config's model_conf; SenseVoice's prompt (language, text
    normalisation) becomes the graph's language and textnorm inputs."""
    blank = int(model_conf.get("blank_id", 0))
    spec = family_spec(family)
    if spec.decoding == PARAFORMER:
        drop = frozenset({int(model_conf.get("sos", 1)), int(model_conf.get("eos", 2)), blank})
        return ParaformerFamily(family, blank, drop=drop)
    return Family(family, blank, spec.prompt(language, textnorm))


class _Detokenizer:
    """Token ids -> text as the PyTorch model's tokenizer does it: sentencepiece, or a token list."""

    def __init__(self, export_dir: Path, config: dict) -> None:
        bpemodel = (config.get("tokenizer_conf") or {}).get("bpemodel")
        self.sp = None
        if bpemodel:
            import sentencepiece as spm

            self.sp = spm.SentencePieceProcessor(model_file=str(export_dir / Path(bpemodel).name))
        else:
            self.tokens = json.loads((export_dir / "tokens.json").read_text(encoding="utf-8"))

    def piece(self, token: int) -> str:
        """The vocabulary entry of one token id (a sentencepiece piece keeps its "▁")."""
        return self.sp.id_to_piece(token) if self.sp is not None else self.tokens[token]

    def __call__(self, ids: list[int]) -> str:
        if self.sp is not None:
            return self.sp.decode(ids)
        return join_char_tokens([self.tokens[i] for i in ids])  # the hub's Chinese Paraformer


class OnnxASR:
    """Transcribe audio with an exported model: paths (any rate, any channels) or arrays at the model's
    rate in, texts out, ``batch_size`` utterances per onnxruntime call (zero-padded)."""

    def __init__(self, export_dir: str | Path, quantize: bool = False, threads: int | None = None,
                 batch_size: int = 1, device: str = "cpu", language: str = "auto",
                 textnorm: str = "woitn") -> None:
        self.dir = Path(export_dir)
        config = yaml.safe_load((self.dir / "config.yaml").read_text(encoding="utf-8"))
        self.family = export_family(self.dir, config)
        self.fbank_conf = FbankConf.from_frontend_conf(config.get("frontend_conf") or {})
        self.fs = self.fbank_conf.fs
        self.extractor = NumpyFbank(self.fbank_conf)
        self.shift, self.scale = read_am_mvn(self.dir / "am.mvn")
        self.detokenize = _Detokenizer(self.dir, config)
        self.parts = family_parts(self.family, config.get("model_conf") or {}, language, textnorm)
        self.model_file = self.dir / ("model_quant.onnx" if quantize else "model.onnx")
        # No spinning: onnxruntime's idle threads would take the cores from the pipeline's worker.
        self.session = make_session(self.model_file, threads or available_cores(), device, spin=False)
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.batch_size = batch_size
        self._pool: ThreadPoolExecutor | None = None

    def _wave(self, item: str | np.ndarray) -> tuple[np.ndarray, int]:
        return (item, self.fs) if isinstance(item, np.ndarray) else load_audio(item)

    def features(self, items: Sequence[str | np.ndarray]) -> list[np.ndarray]:
        """(frames, dim) float32 model input of each path (raises features.audio.AudioError) or array."""
        waves = [self._wave(x) for x in items]
        if len(waves) == 1:  # the batched fbank's bookkeeping costs more than it saves on one clip
            fbanks = [self.extractor.from_wave(*waves[0])]
        else:
            fbanks = self.extractor.from_waves(waves)
        out = []
        for fbank in fbanks:
            feats = lfr(fbank, self.fbank_conf.lfr_m, self.fbank_conf.lfr_n) + self.shift
            feats *= self.scale
            out.append(feats)
        return out

    def infer(self, feats: list[np.ndarray],
              extra: dict[str, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(scores (B, T', V), valid lengths (B,)) of a list of feature matrices, zero-padded.
        ``extra``: per-utterance values of the family's other inputs (SenseVoice's language and
        textnorm: a server batches requests that ask for different ones), else the runtime's own."""
        lengths = np.array([f.shape[0] for f in feats], dtype=np.int32)
        batch = np.zeros((len(feats), int(lengths.max()), feats[0].shape[1]), dtype=np.float32)
        for i, f in enumerate(feats):
            batch[i, : f.shape[0]] = f
        inputs = {"speech": batch, "speech_lengths": lengths, **(extra or self.parts.inputs(len(feats)))}
        scores, out_lens = self.session.run(None, {k: inputs[k] for k in self.input_names})[:2]
        return scores, out_lens

    def decode(self, scores: np.ndarray, n: int) -> str:
        """The text of one utterance's first ``n`` rows of scores, by the model's inference rule."""
        return self._text(scores[:n].argmax(axis=-1))

    def _text(self, best: np.ndarray) -> str:
        """Text of one utterance's best token per output frame."""
        return self.detokenize(self.parts.token_ids(best))

    def _batch(self, feats: list[np.ndarray]) -> list[str]:
        """Texts of a batch of feature matrices, in this thread."""
        out = self._infer_or_split(feats)
        return self._texts(*out) if isinstance(out, tuple) else out

    def _texts(self, scores: np.ndarray, out_lens: np.ndarray) -> list[str]:
        best = scores.argmax(axis=-1)  # one pass over the batch's (B, T', V) scores
        return [self._text(b[:n]) for b, n in zip(best, out_lens.tolist(), strict=True)]

    def _infer_or_split(self, feats: list[np.ndarray]) -> list[str] | tuple[np.ndarray, np.ndarray]:
        """The batch's scores, or its texts where onnxruntime rejected the batch (decoded one by one)."""
        try:
            return self.infer(feats)
        except NO_OUTPUT:
            if len(feats) == 1:  # too short for the model: no transcript, as funasr gives none
                return [""]
            return [t for f in feats for t in self._batch([f])]

    def __call__(self, items: str | np.ndarray | Sequence[str | np.ndarray]) -> list[str]:
        if isinstance(items, (str, np.ndarray)):
            items = [items]
        batches = [items[i:i + self.batch_size] for i in range(0, len(items), self.batch_size)]
        # A pipeline over the batches: one worker thread computes the features of batch k+1 and the texts
        # of batch k-1 while onnxruntime runs batch k (both release the GIL), so the frontend and the
        # argmax over the vocabulary (a third of the time on 2 cores) overlap the network instead of
        # adding to it: 1.35x the utterances/s of running them in turn on 2 cores, at batch 8.
        if len(batches) <= 1:  # one batch: nothing to overlap, and a thread hand-off costs latency
            return [t for b in batches for t in self._batch(self.features(b))]
        worker = self._worker()
        pending: list[Future] = []
        features = worker.submit(self.features, batches[0])
        for k in range(len(batches)):
            feats = features.result()
            if k + 1 < len(batches):
                features = worker.submit(self.features, batches[k + 1])
            out = self._infer_or_split(feats)
            pending.append(worker.submit(self._texts, *out) if isinstance(out, tuple)
                           else _done(out))
        return [t for f in pending for t in f.result()]

    def _worker(self) -> ThreadPoolExecutor:
        """The pipeline's thread, started on first use and kept (a new thread per call costs latency)."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="onnx_asr")
        return self._pool


def _done(value: list[str]) -> Future:
    future: Future = Future()
    future.set_result(value)
    return future
