"""The model card (README.md) of a stage-5 package: what the model is, what it was trained and tested
on, how well it does, how faithful its export is, how fast each runtime runs it, and how to run it.

Reads what packaging/package.py gathers (a ``CardInputs``); writes nothing itself: ``render`` returns the
Markdown. Every file of the package is named in the "Files" section as ``- `path`: what``; the tests
check that each one is in the package and in its tarball.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from funasr_recipe.core.fmt import pct
from funasr_recipe.families.registry import FUNASR_ONNX, family_spec


@dataclass
class CardInputs:
    tag: str
    family: str
    parameters: int | None
    files: dict[str, str]                  # package path -> what it is (the "Files" section)
    triton_models: list[dict]              # triton_ensemble.py's: repo, name, role, kind, I/O, ...
    trt: dict                              # shapes and seconds of build_trt.sh
    export: dict                           # export.json
    parity: dict                           # parity.json
    train_config: dict = field(default_factory=dict)
    corpus: dict | None = None             # data/corpus.json
    sets: dict[str, dict] = field(default_factory=dict)  # set -> data/<set>/report.json
    results_md: str | None = None
    benchmark_md: str | None = None
    tokenizer: str | None = None
    trained: str | None = None             # what the model is and how it was made (model/provenance.py)


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
    lines = ["## Model", "", f"- package tag: `{c.tag}` (the experiment dir's name); class `{c.family}` "
             f"(funasr {c.export.get('versions', {}).get('funasr', '?')}); parameters: {params}",
             *([f"- trained: {c.trained}"] if c.trained else []),
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
            "",
            *runtime_frontend_lines(p)]


def runtime_frontend_lines(p: dict) -> list[str]:
    """The deployed frontend's line of the parity section (exports before it have none)."""
    if "identical_fraction_runtime_frontend" not in p:
        return []
    return [f"The runtime computes its own features (numpy, no torch): from the audio files, they differ "
            f"from the model's frontend by {p['feature_diff_p999']:.1e} at the 99.9th percentile and "
            f"{p['max_abs_feature_diff']:.1e} at most, and ONNX fp32 on them gives PyTorch's transcript for "
            f"{_pct(p['identical_fraction_runtime_frontend'])} of the utterances.", ""]


# Audio at the model's rate as the recipe makes it (runtime/ ships it, in numpy): torchaudio's sinc
# kernel, as AutoModel and training resample. funasr-onnx given a path resamples with librosa (soxr)
# instead, and given an array takes it for audio at the model's rate whatever its rate.
RESAMPLE_IMPORTS = ["from funasr_recipe.features.audio import load_audio",
                    "from funasr_recipe.features.numpy_fbank import mono_at_rate"]
RESAMPLE = ["wave, rate = load_audio(\"a.wav\")  # (samples, channels) float32, any rate",
            "wave = mono_at_rate(wave, rate, {fs})  # downmixed, resampled as in training"]


def funasr_onnx_usage(family: str, fs: int = 16000) -> list[str]:
    """How to run the package with funasr-onnx, or why not (it has no CTC-only class)."""
    if FUNASR_ONNX not in family_spec(family).runtimes:
        return [f"funasr-onnx has no class for {family}: use the recipe's runtime above, or Triton below.",
                ""]
    return [f"With funasr-onnx: give it arrays at {fs} Hz resampled as the recipe resamples (torchaudio's "
            "sinc, as in training; `torchaudio.functional.resample` is the same kernel). Given a path, "
            "funasr-onnx resamples with librosa's soxr, which changes the features of a file at another "
            f"rate and with them some transcripts; given an array, it takes it for {fs} Hz audio whatever "
            "its rate. It takes one array per call (a list must hold paths), and 4 threads unless told:", "",
            "```python", "# PYTHONPATH=runtime: the recipe's reader and resampler", *RESAMPLE_IMPORTS,
            f"from funasr_onnx import {family} as Model", "", *(line.format(fs=fs) for line in RESAMPLE),
            "model = Model(\"onnx\", batch_size=1, quantize=False, intra_op_num_threads=2)",
            "print(model(wave))", "```", ""]


def sherpa_onnx_usage(c: CardInputs, fs: int) -> list[str]:
    """How to run the package with sherpa-onnx, where stage 4 wrote its files (SenseVoiceSmall)."""
    if "onnx/tokens.txt" not in c.files:
        return []
    return ["With sherpa-onnx (`onnx/tokens.txt`, and its metadata in the ONNX files; its texts drop the "
            "tags), on the audio resampled as above:", "",
            "```python", "import sherpa_onnx", "",
            "recognizer = sherpa_onnx.OfflineRecognizer.from_sense_voice(",
            "    model=\"onnx/model.onnx\", tokens=\"onnx/tokens.txt\", num_threads=2,",
            f"    sample_rate={fs}, language=\"auto\", use_itn=False)",
            "stream = recognizer.create_stream()", f"stream.accept_waveform({fs}, wave)",
            "recognizer.decode_stream(stream)", "print(stream.result.text)", "```", ""]


# What the ensembles' tensors hold, for the card's table of client-side shapes.
ENSEMBLE_TENSORS = {
    "WAV": "mono samples in [-1, 1] at {fs} Hz (resample first), rows zero-padded to the longest",
    "WAV_LENS": "the true samples of each row of WAV",
    "LANGUAGE": "optional prompt id, default 0 (auto); 3 zh, 4 en, 7 yue, 11 ja, 12 ko",
    "TEXTNORM": "optional prompt id, default 15 (woitn); 14 withitn",
    "TEXT": "UTF-8 text as the recipe's runtime returns it (SenseVoice's tags kept)",
    "LANGUAGE_TAG": "the text's language tag (en, zh, ...; empty where none)",
    "EMOTION_TAG": "its emotion tag (NEUTRAL, HAPPY, ...)", "EVENT_TAG": "its event tag (Speech, BGM, ...)"}


def _io(m: dict) -> str:
    return ("inputs " + ", ".join(f"{n} {t} {d}" for n, t, d in m["inputs"]) + "; outputs "
            + ", ".join(f"{n} {t} {d}" for n, t, d in m["outputs"]))


def triton_section(c: CardInputs) -> list[str]:
    """How to serve the package with Triton: the two repositories, the ensembles' client-side shapes, the
    encoders' own (packaging/triton_ensemble.py writes them)."""
    fs = (c.train_config.get("frontend_conf") or {}).get("fs", 16000)
    ensembles = [m for m in c.triton_models if m["role"] == "ensemble"]
    rows = [f"| {n} | {'input' if k == 'inputs' else 'output'} | {t} | {d} | "
            f"{ENSEMBLE_TENSORS.get(n, '').format(fs=fs)} |" for k in ("inputs", "outputs")
            for n, t, d in ensembles[0][k]]
    listed = "\n".join(f"- `{m['repo']}/{m['name']}/config.pbtxt` ({m['what']}, {m['kind']}): {_io(m)}"
                       for m in c.triton_models if m["role"] == "encoder")
    return [
        "With Triton: two model repositories. `triton/` starts on any machine (python models on CPU, the "
        "int8 encoder on CPU, the fp32 one on the GPU where there is one); `triton_gpu/` holds the fp16-I/O "
        "encoder, which asks for onnxruntime's TensorRT provider in FP16 on a GPU (KIND_GPU): it would not "
        "load without one, and tritonserver exits when a model fails to load, hence its own repository. "
        "Its models have their own names, so that a GPU server can serve both:", "",
        "```bash", "tritonserver --model-repository triton                                  # CPU or GPU",
        "tritonserver --model-repository triton --model-repository triton_gpu   # GPU, fp16 too", "```", "",
        "The python models (feature extraction, decoding: the recipe's own, so the texts are the runtime's) "
        "import the recipe's code from `runtime/` (their `runtime_dir` parameter, `../../runtime`): give the "
        "server the whole package, not `triton/` alone, and an image with Triton's python backend and "
        "`runtime/requirements.txt` installed.", "",
        "Audio in, text out: the ensembles "
        + ", ".join(f"`{m['name']}` ({m['precision']}, in {m['repo']}/)" for m in ensembles)
        + " run feature extraction, the encoder and decoding. Client-side shapes, batch first (-1: any; "
        f"up to {ensembles[0]['max_batch']} clips a request):", "",
        "| tensor | | type | shape | holds |", "|---|---|---|---|---|", *rows, "",
        "Features in, scores out: the encoders alone, for a client that computes the features itself "
        "(pad speech to a few length buckets so that requests batch, and send the true speech_lengths); "
        f"it decodes the outputs as the runtime does: {family_spec(c.family).decoding_doc}; then the "
        "tokenizer's pieces to text. The fp16 model takes and returns float16 tensors (casts at the "
        "graph's edges, fp32 weights); the int8 one (dynamic quantisation) is for CPU instances.", "",
        listed, "",
        "A clip too short for the encoder gets an error from Triton where the runtime returns an empty text.",
        ""]


def usage_section(c: CardInputs) -> list[str]:
    fs = int((c.train_config.get("frontend_conf") or {}).get("fs", 16000))
    return [
        "## How to run it", "", "Commands run from the package's top directory.", "",
        "Install the runtime's dependencies, every version pinned to the ones the recipe tested, in an "
        "environment of their own (Python 3.11):", "",
        "```bash", "python3.11 -m venv .venv && .venv/bin/pip install -r runtime/requirements.txt",
        "source .venv/bin/activate", "```", "",
        "With the recipe's runtime (`runtime/`: audio read with soundfile, the training frontend's fbank "
        "and resampler in numpy, so no torch; threads from the cores available):", "",
        "```bash",
        "PYTHONPATH=runtime python -m funasr_recipe.runtime.transcribe onnx a.wav b.wav [--int8] \\",
        "    [--batch-size 8] [--threads N]",
        "```", "",
        "As an HTTP service with a web page at http://127.0.0.1:8000/ (the recipe's stage 6: "
        "`POST /v1/transcriptions`, OpenAI's `POST /v1/audio/transcriptions`, `/health`, `/metrics`):", "",
        "```bash",
        "PYTHONPATH=runtime python -m funasr_recipe.serving.cli --model-dir onnx [--port 8000] "
        "[--precision int8]",
        "curl -F file=@a.wav http://127.0.0.1:8000/v1/transcriptions",
        "```", "",
        "Beyond 127.0.0.1, give it API keys (`--api-key-file FILE`, one per line, or $RECIPE_API_KEY_FILE; "
        "clients send `Authorization: Bearer <key>`) and a TLS proxy in front. `deploy/Containerfile` "
        "(`docker build -t asr -f deploy/Containerfile .`) and `deploy/asr.service` (systemd) are examples "
        "that do both.", "", *funasr_onnx_usage(c.family, fs), *sherpa_onnx_usage(c, fs),
        *triton_section(c),
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
