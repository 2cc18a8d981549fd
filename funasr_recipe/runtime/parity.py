"""Parity of an ONNX export with its PyTorch model on real audio (stage 4's check; local/export.py runs it).

Reads the utterances of a stage-0 data.jsonl (key, source = audio path, target, text_language), the
PyTorch model (funasr's AutoModel) and <export-dir>/model.onnx and model_quant.onnx; returns the
report that local/export.py writes as <export-dir>/parity.json.

Each utterance's features (fbank + LFR + CMVN) are computed once, by the model's own frontend with
dither off, and fed to all three: PyTorch through the model's own ``inference`` (what stage 3 decodes
with), ONNX fp32 and int8 through the recipe's runtime (runtime/onnx_asr.py: the session and the
decoding rule that the benchmark, the package and the server run). That runtime decodes with the rule
of the model's ``inference``, so that a difference means the networks differ, never the decoding code:
greedy CTC for SenseVoiceSmall (with language "auto" and no ITN, as stage 3 and funasr-onnx decode)
and ConformerCTC, and for Paraformer the argmax of each of the predictor's tokens. No padding enters
either side (funasr's Paraformer, and ConformerCTC's conv2d subsampling, score an utterance differently
inside a padded batch, in PyTorch as in ONNX): for the CTC families PyTorch and ONNX fp32 decode the
utterances of one length together (at most BATCH_FRAMES frames a batch: the demo's 500 dev clips have
30-odd lengths), whose rows come out as each alone would (the same transcripts, and the same largest
log-probability difference, 1.1e-5, as one at a time); ONNX int8 one at a time, as dynamic quantization
scales a batch's activations together (batched, 99.4% of the demo's int8 transcripts equal PyTorch's
instead of 99.2%); Paraformer, whose decoder pads the predictor's token counts, one at a time. An
input too short for the model (funasr returns nothing, onnxruntime raises) counts as an empty
transcript and is listed under "no_output".

Pass: fp32 transcripts (SenseVoice tags included) identical to PyTorch on >= 99% of utterances, and
int8's error rate (``scoring.error_rate.corpus_counts``, tags stripped) within 1% absolute of fp32's,
or of one word or character where that is more (``int8_tolerance``).
The largest absolute log-probability difference between PyTorch and fp32 is reported, not gated.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from funasr_recipe.core.log import Progress
from funasr_recipe.core.rejections import BadInputError
from funasr_recipe.data.tags import strip_tags
from funasr_recipe.families.registry import PARAFORMER, family_spec
from funasr_recipe.features.audio import AudioError, load_audio
from funasr_recipe.features.fbank import resample
from funasr_recipe.features.numpy_fbank import (
    MAX_TOLERANCE,
    P999_TOLERANCE,
    feature_difference,
    within_tolerance,
)
from funasr_recipe.runtime.defaults import MAX_INT8_WER_DELTA, MIN_IDENTICAL, PARITY_THREADS
from funasr_recipe.runtime.export import family_of
from funasr_recipe.runtime.onnx_asr import NO_OUTPUT, OnnxASR
from funasr_recipe.scoring.error_rate import Counts, corpus_counts

log = logging.getLogger(__name__)
Decoded = tuple[str, np.ndarray | None]  # a transcript, its (frames, vocabulary) log-probabilities

# Feature frames per batch of equal-length utterances: each side holds a few (frames, vocabulary) float
# tensors, 25,055 wide for SenseVoice: 100 MB each at 1,000 frames.
BATCH_FRAMES = 1000


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """torch's intra-op threads set to ``n`` for the block, then restored."""
    before = torch.get_num_threads()
    if before != n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if before != n:
            torch.set_num_threads(before)


def _no_output() -> tuple[type[Exception], ...]:
    """An input too short for the model (conv subsampling; a Paraformer predicting no token): funasr's
    inference returns no transcript, onnxruntime raises (and funasr-onnx returns ""). Both count as "".
    Imported when needed: stage 4 imports funasr only after compat/lazy_import.install."""
    from funasr.models.transformer.utils.subsampling import TooShortUttError

    return (TooShortUttError, *NO_OUTPUT)


class TorchSide:
    """The PyTorch model of an AutoModel: its frontend (dither off) and its own ``inference``."""

    def __init__(self, automodel: Any) -> None:
        self.model = automodel.model.eval()
        self.family = family_of(self.model)
        self.spec = family_spec(self.family)
        self.tokenizer = automodel.kwargs["tokenizer"]
        # funasr's WavFrontend dithers by default (random noise in every call): both sides must see the
        # same features, and stage 1 computes them without dither too.
        self.frontend = copy.copy(automodel.kwargs["frontend"])
        self.frontend.dither = 0.0
        # The module whose output holds the scores that inference takes its argmax of (pre-softmax).
        self.scored = self.model.decoder if self.spec.decoding == PARAFORMER else self.model.ctc.ctc_lo

    @torch.no_grad()
    def features(self, source: str) -> torch.Tensor:
        """(frames, dim) model input of one audio file; raises AudioError."""
        data, rate = load_audio(source)
        wave = resample(torch.from_numpy(data.mean(axis=1))[None], rate, int(self.frontend.fs))
        feats, _ = self.frontend(wave, torch.tensor([wave.shape[1]]))
        return feats[0]

    @torch.no_grad()
    def decode(self, keys: list[str], feats: list[torch.Tensor]) -> list[Decoded]:
        """(transcript, (n, vocab) log-probs or None when the model produced no scores) of each of a
        batch of utterances of one length, in order."""
        captured: list[torch.Tensor] = []
        handle = self.scored.register_forward_hook(
            lambda _m, _i, out: captured.append(out[0] if isinstance(out, tuple) else out))
        # inference adds to the lengths in place (SenseVoice's prompt): give it a fresh tensor.
        lengths = torch.tensor([f.shape[0] for f in feats])
        paraformer = self.spec.decoding == PARAFORMER
        try:
            out = self.model.inference(
                torch.stack(feats), data_lengths=lengths[:, None] if paraformer else lengths,
                key=list(keys), tokenizer=self.tokenizer, frontend=self.frontend, data_type="fbank",
                device="cpu", language="auto", use_itn=False)
        finally:
            handle.remove()
        results = out[0] if out else []  # Paraformer returns [], not ([], meta), when it predicts no token
        texts = [r["text"] for r in results] if len(results) == len(keys) else [""] * len(keys)
        scores = torch.log_softmax(captured[-1].float(), dim=-1).numpy() if captured else None
        return [(text, None if scores is None else scores[i]) for i, text in enumerate(texts)]


def onnx_decode(asr: OnnxASR, feats: list[torch.Tensor] | list[np.ndarray]) -> list[Decoded]:
    """(transcript, (n, vocab) log-probs or None without output frames) of each of a batch of
    utterances of one length, by the recipe's runtime."""
    scores, lengths = asr.infer([np.asarray(f, dtype=np.float32) for f in feats])
    out: list[Decoded] = []
    for row, n in zip(scores, lengths.tolist(), strict=True):
        if n < 1:
            out.append(("", None))
            continue
        lp = torch.log_softmax(torch.from_numpy(row[:n]).float(), dim=-1).numpy()
        out.append((asr.decode(lp, n), lp))
    return out


def batches(feats: list[torch.Tensor], family: str) -> list[list[int]]:
    """Indices of ``feats`` in batches of one length (BATCH_FRAMES frames at most), in first-seen order of
    the lengths; one utterance a batch for Paraformer."""
    if family_spec(family).decoding == PARAFORMER:
        return [[i] for i in range(len(feats))]
    by_length: dict[int, list[int]] = {}
    for i, f in enumerate(feats):
        by_length.setdefault(int(f.shape[0]), []).append(i)
    out = []
    for n, group in by_length.items():
        size = max(1, BATCH_FRAMES // max(n, 1))
        out += [group[i:i + size] for i in range(0, len(group), size)]
    return out


def _decode(side: str, keys: list[str], call: Callable[[], list[Decoded]],
            errors: list[dict]) -> list[Decoded]:
    """``call()``: one side's decode of a batch. An input too short for the model (the batch is of one
    length: all of it) gives each an empty transcript, listed under no_output."""
    try:
        return call()
    except _no_output() as e:
        for key in keys:
            log.warning("%s: %s gives no output (%s: %s); counted as an empty transcript", key, side,
                        type(e).__name__, str(e).splitlines()[0][:200])
            errors.append({"key": key, "side": side, "error": type(e).__name__})
        return [("", None)] * len(keys)


def runtime_frontend(asr: OnnxASR, utts: list[dict], feats: list[torch.Tensor], torch_texts: list[str],
                     groups: list[list[int]], no_output: list[dict]) -> dict:
    """The deployed path against the model's frontend: the runtime's own features of each utterance
    (features/numpy_fbank.py, from the audio file) against the model's, and ONNX fp32's transcripts
    of them against PyTorch's ``torch_texts``, batched as ``groups``."""
    ours = [asr.features([u["source"]])[0] for u in utts]
    frames = [u["key"] for u, a, b in zip(utts, ours, feats, strict=True) if a.shape != tuple(b.shape)]
    same = [(a, b.numpy()) for a, b in zip(ours, feats, strict=True) if a.shape == tuple(b.shape)]
    # CMVN divides log-mel by its spread (2-5 on speech), so the fbank's tolerances hold here too.
    p999, largest = feature_difference([a for a, _ in same], [b for _, b in same])
    texts = [""] * len(utts)
    for group in groups:  # of one length in the model's frames; a frame mismatch is reported above
        for part in ([[i] for i in group] if frames else [group]):
            got = _decode("fp32 runtime frontend", [utts[i]["key"] for i in part],
                          lambda part=part: onnx_decode(asr, [ours[i] for i in part]), no_output)
            for i, (text, _) in zip(part, got, strict=True):
                texts[i] = text
    identical = sum(a == b for a, b in zip(torch_texts, texts, strict=True)) / len(utts)
    return {"identical_fraction_runtime_frontend": identical, "feature_diff_p999": p999,
            "max_abs_feature_diff": largest, "feature_frame_mismatches": frames}


def _max_diff(a: np.ndarray | None, b: np.ndarray | None) -> tuple[float, bool]:
    """(largest |a - b| over the common frames, whether the lengths agree)."""
    if a is None or b is None:
        return 0.0, a is None and b is None
    n = min(len(a), len(b))
    diff = float(np.abs(a[:n] - b[:n]).max()) if n else 0.0
    return diff, a.shape == b.shape


def _rate(counts: Counts) -> float | None:
    return None if math.isinf(counts.rate) else counts.rate


def int8_tolerance(max_int8_delta: float, n_ref: int) -> float:
    """The int8 gate's allowed error-rate difference: ``max_int8_delta``, but never below one error in the
    set's ``n_ref`` reference units (words or characters, as scored). On 50 one-word clips one changed word
    moves the rate by 2 points, so a 1-point gate failed whenever int8 differed by a single word (a flake
    of CI's fixture, not a broken export); on the 500-clip demo set one word is 0.2 points and the 1-point
    gate is what judges."""
    # The epsilon: rates are quotients, and exactly one unit apart must pass.
    return max(max_int8_delta, 1 / n_ref if n_ref else 0.0) + 1e-9


def check_parity(automodel: Any, export_dir: Path, utts: list[dict], threads: int = PARITY_THREADS,
                 min_identical: float = MIN_IDENTICAL, max_int8_delta: float = MAX_INT8_WER_DELTA,
                 desc: str = "parity") -> dict:
    """Decode ``utts`` with PyTorch, ONNX fp32 and ONNX int8 on the same features, each on ``threads``
    threads; the parity report."""
    with torch_threads(threads):
        return _check_parity(automodel, export_dir, utts, threads, min_identical, max_int8_delta, desc)


def _check_parity(automodel: Any, export_dir: Path, utts: list[dict], threads: int, min_identical: float,
                  max_int8_delta: float, desc: str) -> dict:
    torch_side = TorchSide(automodel)
    onnx = {name: OnnxASR(export_dir, quantize=quantize, threads=threads)
            for name, quantize in (("fp32", False), ("int8", True))}
    kept, feats, unreadable, length_mismatch, no_output = [], [], [], [], []
    progress = Progress(f"{desc} features", len(utts), logger=log)
    for utt in utts:
        progress.update()
        try:
            feats.append(torch_side.features(utt["source"]))
        except AudioError as e:
            log.error("%s: %s; left out of the parity check", utt["key"], e)
            unreadable.append({"key": utt["key"], "error": str(e)})
            continue
        kept.append(utt)
    progress.close()
    if not kept:
        raise BadInputError("no utterance of the set could be read: nothing to check parity on")
    hyps = {name: [""] * len(kept) for name in ("torch", "fp32", "int8")}
    seconds = dict.fromkeys(hyps, 0.0)
    diffs = {"fp32": 0.0, "int8": 0.0}
    progress = Progress(desc, len(kept), logger=log)
    for batch in batches(feats, torch_side.family):
        keys, fs = [kept[i]["key"] for i in batch], [feats[i] for i in batch]
        start = time.perf_counter()
        ref = _decode("torch", keys, lambda keys=keys, fs=fs: torch_side.decode(keys, fs), no_output)
        seconds["torch"] += time.perf_counter() - start
        for i, (text, _) in zip(batch, ref, strict=True):
            hyps["torch"][i] = text
        for name, side in onnx.items():
            start = time.perf_counter()
            # int8 one at a time: onnxruntime's dynamic quantization scales a batch's activations
            # together, so the rows of a batch change each other's int8 scores (module docstring).
            parts = [[j] for j in range(len(batch))] if name == "int8" else [list(range(len(batch)))]
            got = [d for part in parts for d in _decode(
                name, [keys[j] for j in part],
                lambda side=side, part=part, fs=fs: onnx_decode(side, [fs[j] for j in part]), no_output)]
            seconds[name] += time.perf_counter() - start
            for i, (text, scores), (_, ref_scores) in zip(batch, got, ref, strict=True):
                hyps[name][i] = text
                diff, same_length = _max_diff(ref_scores, scores)
                diffs[name] = max(diffs[name], diff)
                if name == "fp32" and not same_length:
                    length_mismatch.append(i)
        progress.update(len(batch))
    progress.close()

    n = len(kept)
    frontend = runtime_frontend(onnx["fp32"], kept, feats, hyps["torch"], batches(feats, torch_side.family),
                                no_output)
    identical = sum(a == b for a, b in zip(hyps["torch"], hyps["fp32"], strict=True)) / n
    identical_int8 = sum(a == b for a, b in zip(hyps["torch"], hyps["int8"], strict=True)) / n
    refs, langs = [u["target"] for u in kept], [u["lang"] for u in kept]
    counts = {name: corpus_counts(refs, [strip_tags(t) for t in h], langs) for name, h in hyps.items()}
    wer = {name: _rate(c) for name, c in counts.items()}
    failures = []
    if identical < min_identical:
        failures.append(f"ONNX fp32 transcripts identical to PyTorch on {identical:.1%} of utterances, "
                        f"below {min_identical:.0%}")
    if frontend["identical_fraction_runtime_frontend"] < min_identical:
        failures.append(f"ONNX fp32 transcripts from the runtime's own features identical to PyTorch on "
                        f"{frontend['identical_fraction_runtime_frontend']:.1%} of utterances, below "
                        f"{min_identical:.0%}")
    if not within_tolerance(frontend["feature_diff_p999"], frontend["max_abs_feature_diff"]) \
            or frontend["feature_frame_mismatches"]:
        failures.append(f"the runtime's features differ from the model's frontend by "
                        f"{frontend['feature_diff_p999']:.2e} at the 99.9th percentile (limit "
                        f"{P999_TOLERANCE:.0e}) and {frontend['max_abs_feature_diff']:.2e} at most (limit "
                        f"{MAX_TOLERANCE:.0e}); {len(frontend['feature_frame_mismatches'])} utterances "
                        "with other frame counts")
    if wer["fp32"] is None or wer["int8"] is None:
        failures.append("the error rate is undefined (references without tokens)")
    elif abs(wer["int8"] - wer["fp32"]) > int8_tolerance(max_int8_delta, counts["fp32"].n_ref):
        failures.append(f"int8 error rate {wer['int8']:.2%} is more than {max_int8_delta:.0%} (and more "
                        f"than one word or character) away from fp32's {wer['fp32']:.2%}")
    rows = zip(kept, hyps["torch"], hyps["fp32"], hyps["int8"], strict=True)
    mismatches = [{"key": u["key"], "ref": u["target"], "torch": t, "fp32": f, "int8": q}
                  for u, t, f, q in rows if t != f]
    return {
        "family": torch_side.family, "utterances": n, "identical_fraction": identical,
        "identical_fraction_int8": identical_int8, "max_abs_logit_diff": diffs["fp32"],
        "max_abs_logit_diff_int8": diffs["int8"], "logit_diff_unit": "log-probability",
        "wer_torch": wer["torch"], "wer_fp32": wer["fp32"], "wer_int8": wer["int8"],
        **frontend,
        "thresholds": {"identical_fraction": min_identical, "int8_wer_delta": max_int8_delta,
                       "feature_diff_p999": P999_TOLERANCE, "max_abs_feature_diff": MAX_TOLERANCE},
        "pass": not failures, "failures": failures, "mismatches": mismatches,
        "length_mismatches": [kept[i]["key"] for i in sorted(length_mismatch)], "unreadable": unreadable,
        "no_output": no_output,
        "decode_seconds": {k: round(v, 3) for k, v in seconds.items()},
        "language": "auto" if torch_side.spec.language_ids else None,
    }
