"""The model card (README.md) of a stage-5 package: what the model is, what it was trained and tested
on, how well it does, how faithful its export is, how fast each runtime runs it, and how to run it.

Reads what reports/package.py gathers (a ``CardInputs``); writes nothing itself: ``render`` returns the
Markdown. Every file of the package is named in the "Files" section as ``- `path`: what``; the tests
check that each one is in the package and in its tarball.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from funasr_recipe.core.fmt import pct


@dataclass
class CardInputs:
    tag: str
    family: str
    parameters: int | None
    files: dict[str, str]                  # package path -> what it is (the "Files" section)
    triton_models: list[dict]              # name, variant, kind, inputs/outputs as (name, type, dims)
    trt: dict                              # shapes and seconds of build_trt.sh
    export: dict                           # export.json
    parity: dict                           # parity.json
    train_config: dict = field(default_factory=dict)
    corpus: dict | None = None             # data/corpus.json
    sets: dict[str, dict] = field(default_factory=dict)  # set -> data/<set>/report.json
    results_md: str | None = None
    benchmark_md: str | None = None
    tokenizer: str | None = None


def demote(markdown: str, levels: int = 2) -> str:
    """Headings of an embedded document pushed down ``levels`` levels, under the card's own."""
    return "\n".join("#" * levels + line if line.startswith("#") else line
                     for line in markdown.strip().splitlines())


def _pct(x: float | None) -> str:
    return pct(x, missing="n/a")


def data_section(c: CardInputs) -> list[str]:
    lines = ["## Data", ""]
    if c.corpus:
        get = c.corpus.get
        lines.append(f"Corpus `{get('corpus', '?')}` (language {get('language', '?')}); "
                     f"train set `{get('train_set', '?')}`, validation `{get('valid_set', '?')}`, "
                     f"test sets {', '.join(f'`{s}`' for s in get('test_sets', []))}.")
    else:
        lines.append("No data/corpus.json was found next to the test set: the corpus is not described here.")
    if c.sets:
        lines += ["", "| set | utterances | hours | rejected | duration s (min-max) | resampled |",
                  "|---|---:|---:|---:|---|---:|"]
        for name, r in sorted(c.sets.items()):
            d = r.get("duration_s") or {}
            resampled = (r.get("converted") or {}).get("resampled", 0)
            lines.append(f"| {name} | {r.get('accepted', '?')} | {r.get('hours', '?')} "
                         f"| {r.get('rejected', '?')} | {d.get('min', '?')}-{d.get('max', '?')} "
                         f"| {resampled} |")
    return lines + [""]


def model_section(c: CardInputs) -> list[str]:
    enc = c.train_config.get("encoder_conf") or {}
    front = c.train_config.get("frontend_conf") or {}
    params = "unknown" if c.parameters is None else f"{c.parameters:,} ({c.parameters / 1e6:.1f} M)"
    lines = ["## Model", "", f"- tag: `{c.tag}`; class `{c.family}` (funasr "
             f"{c.export.get('versions', {}).get('funasr', '?')}); parameters: {params}",
             f"- encoder: {c.train_config.get('encoder', '?')}, width {enc.get('output_size', '?')}, "
             f"{enc.get('num_blocks', '?')} blocks, {enc.get('attention_heads', '?')} heads",
             f"- frontend: {front.get('n_mels', 80)} mel bins at {front.get('fs', 16000)} Hz, "
             f"LFR {front.get('lfr_m', 1)}/{front.get('lfr_n', 1)}, global CMVN (`onnx/am.mvn`)"]
    if c.tokenizer:
        lines.append(f"- tokenizer: `onnx/{c.tokenizer}`")
    sizes = c.export.get("files") or {}
    lines.append(f"- ONNX opset {c.export.get('opset', '?')}: fp32 {sizes.get('model.onnx', 0) / 2**20:.1f} "
                 f"MiB, int8 {sizes.get('model_quant.onnx', 0) / 2**20:.1f} MiB "
                 f"({c.export.get('quantization', '')})")
    return lines + [""]


def parity_section(c: CardInputs) -> list[str]:
    p = c.parity
    return ["## Export parity (stage 4, `onnx/parity.json`)", "",
            f"ONNX against PyTorch on the same features of {p.get('utterances', '?')} test utterances: "
            f"{'passed' if p.get('pass') else 'FAILED'}.", "",
            "| | PyTorch | ONNX fp32 | ONNX int8 |", "|---|---:|---:|---:|",
            f"| transcripts identical to PyTorch | - | {_pct(p.get('identical_fraction'))} "
            f"| {_pct(p.get('identical_fraction_int8'))} |",
            f"| max abs log-prob difference | - | {p.get('max_abs_logit_diff', float('nan')):.2e} "
            f"| {p.get('max_abs_logit_diff_int8', float('nan')):.2e} |",
            f"| error rate | {_pct(p.get('wer_torch'))} | {_pct(p.get('wer_fp32'))} "
            f"| {_pct(p.get('wer_int8'))} |",
            ""]


def funasr_onnx_usage(family: str) -> list[str]:
    """How to run the package with funasr-onnx, or why not (it has no CTC-only class)."""
    if family == "ConformerCTC":
        return ["funasr-onnx has no class for a CTC-only Conformer: use the recipe's runtime above, or "
                "Triton below.", ""]
    return ["With funasr-onnx (its kaldi-native-fbank frontend; set the threads, its default is 4 whatever "
            "the machine):", "",
            "```python", f"from funasr_onnx import {family} as Model",
            "model = Model(\"onnx\", batch_size=8, quantize=False, intra_op_num_threads=2)",
            "print(model([\"a.wav\"]))", "```", ""]


def usage_section(c: CardInputs) -> list[str]:
    decoding = {"SenseVoiceSmall": "greedy CTC on ctc_logits (argmax per frame up to encoder_out_lens, "
                                   "repeats collapsed, blank 0 dropped); inputs language 0 (auto; 3 zh, "
                                   "4 en, 7 yue, 11 ja, 12 ko) and textnorm 15 (woitn; 14 withitn)",
                "Paraformer": "the argmax of each of the first token_num rows of logits, ids 0, 1, 2 "
                              "(blank, <s>, </s>) dropped",
                "ConformerCTC": "greedy CTC on the log-probabilities (blank 0)"}[c.family]
    triton = "\n".join(f"- `triton/{m['name']}/config.pbtxt` ({m['variant']}, {m['kind']}): inputs "
                       + ", ".join(f"{n} {t} {d}" for n, t, d in m["inputs"]) + "; outputs "
                       + ", ".join(f"{n} {t} {d}" for n, t, d in m["outputs"]) for m in c.triton_models)
    return [
        "## How to run it", "", "Commands run from the package's top directory.", "",
        "With the recipe's runtime (`runtime/`: audio read with soundfile, the PyTorch frontend's exact "
        "fbank, threads from the cores available; `runtime/requirements.txt`):", "",
        "```bash",
        "PYTHONPATH=runtime python -m funasr_recipe.runtime.transcribe onnx a.wav b.wav [--int8] \\",
        "    [--batch-size 8] [--threads N]",
        "```", "", *funasr_onnx_usage(c.family),
        "With Triton (onnxruntime backend, dynamic batching; pad speech to a few length buckets so that "
        "requests batch, and send the true speech_lengths):", "",
        "```bash", "tritonserver --model-repository triton", "```", "",
        "Shapes are the ONNX model's, batch first (-1: dynamic). A client decodes the outputs as the "
        f"runtime does: {decoding}; then the tokenizer's pieces to text.", "",
        triton, "",
        "The fp16 model takes and returns float16 tensors (casts at the graph's edges, fp32 weights) and "
        "asks Triton for onnxruntime's TensorRT execution provider in FP16; the int8 model (dynamic "
        "quantisation) is for CPU instances.", "",
        "With TensorRT: `./build_trt.sh [engine.plan]` runs trtexec --fp16 with the profile min/opt/max "
        f"`{c.trt['min']}` / `{c.trt['opt']}` / `{c.trt['max']}` (speech of {c.trt['seconds'][0]:g} s / "
        f"{c.trt['seconds'][1]:g} s / {c.trt['seconds'][2]:g} s), and says so where trtexec is missing.", ""]


def render(c: CardInputs) -> str:
    """README.md of the package."""
    lines = [f"# {c.tag}: {c.family} speech recognition, ONNX package", "",
             f"A {c.family} model trained with this recipe, exported to ONNX (fp32, int8) and packaged for "
             "onnxruntime, funasr-onnx, Triton and TensorRT. Figures below were measured by the recipe's "
             "stages 3-5; none is copied from elsewhere.", "",
             "## Files", ""]
    lines += [f"- `{path}`: {what}" for path, what in c.files.items()]
    lines += [""] + data_section(c) + model_section(c)
    lines += (["## Results (stage 3, `RESULTS.md`)", "", demote(c.results_md), ""] if c.results_md else
              ["## Results (stage 3)", "", "No RESULTS.md: stage 3 was not run for this model.", ""])
    lines += parity_section(c)
    lines += (["## Runtime benchmark (stage 5, `benchmark.md`)", "", demote(c.benchmark_md), ""]
              if c.benchmark_md else
              ["## Runtime benchmark (stage 5)", "", "No benchmark was run for this package.", ""])
    lines += usage_section(c)
    lines += ["## Checks", "", "`SHA256SUMS` holds every file's checksum: `sha256sum -c SHA256SUMS`.", ""]
    return "\n".join(lines)


def read_json(path: Path) -> dict | None:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
