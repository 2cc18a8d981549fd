"""Stage 5: a deployable package of an exported model, and its tarball.

Reads  <exp-dir>/export/ (stage 4, passed: .done and parity.json), <exp-dir>/final/model.pt (for the
       parameter count), <exp-dir>/config.yaml, RESULTS.md, benchmark.{md,json} where present, and
       <data-jsonl> (a test set: its durations set TensorRT's optimal shape; data/corpus.json and
       data/<set>/report.json next to it describe the data in the card);
writes <exp-dir>/package/
         README.md            model card: data, config, RESULTS, parity, benchmark, how to run it
         onnx/                the export dir as funasr-onnx and local/onnx_asr.py load it
         triton/<tag>{,_int8,_fp16}/config.pbtxt + 1/model.onnx
                              Triton model repository (onnxruntime backend, dynamic batching,
                              dynamic time axis; fp32, int8 for CPU, fp16 I/O with TensorRT fp16)
         build_trt.sh         trtexec --fp16 with min/opt/max shapes from the model's inputs
         runtime/             the recipe's ONNX runtime (local/onnx_asr.py and what it imports)
         RESULTS.md, benchmark.{md,json}, train_config.yaml, SHA256SUMS
       <exp-dir>/package.tar.gz  the whole package under <tag>/
       <exp-dir>/package/.done   the marker of a finished run (a rerun with the same inputs skips)

Run local/bench_runtime.py first: the card embeds its table.

  python -m local.package --exp-dir exp/tiny_sensevoice --data-jsonl data/dev/data.jsonl \\
      [--max-batch 32] [--max-seconds 30]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import os
import re
import shutil
import statistics
import sys
import tarfile
from pathlib import Path

import onnx
import yaml

from local.bad_input import run_stage
from local.dist_slice import files_fingerprint, marker_matches
from local.log_utils import setup_logging
from local.model_card import CardInputs, read_json, render
from local.onnx_asr import export_family
from local.triton_repo import (
    TRITON_TYPES,
    Tensor,
    build_trt_script,
    config_pbtxt,
    fp16_io,
    model_frames,
    onnx_io,
    trt_shapes,
)

log = logging.getLogger(__name__)
ROOT = Path(__file__).resolve().parents[1]
# local/onnx_asr.py and what it imports: the package runs without the recipe checked out.
RUNTIME_MODULES = ("__init__.py", "onnx_asr.py", "audio.py", "fbank.py", "cmvn.py", "model_config.py",
                   "conformer_ctc_onnx.py", "ort_utils.py")
RUNTIME_PACKAGES = ("numpy", "soundfile", "torch", "torchaudio", "onnxruntime", "sentencepiece", "PyYAML",
                    "omegaconf", "librosa", "funasr_onnx")  # the last two for conformer_ctc_onnx.py only
MIN_SECONDS = 0.1  # shortest speech in the TensorRT profile


def check_export(export_dir: Path) -> dict:
    """parity.json of a finished, passing stage-4 export; FileNotFoundError/ValueError otherwise."""
    for name in ("model.onnx", "model_quant.onnx", "config.yaml", "am.mvn", "parity.json", ".done"):
        if not (export_dir / name).is_file():
            raise FileNotFoundError(f"{export_dir / name} not found: run stage 4 (local/export.py) first")
    parity = json.loads((export_dir / "parity.json").read_text(encoding="utf-8"))
    if not parity.get("pass"):
        raise ValueError(f"{export_dir / 'parity.json'}: the export failed its parity check; "
                         "not packaging it")
    return parity


def link_or_copy(src: Path, dst: Path) -> None:
    """A hard link (one copy on disk and in the tarball), or a copy across filesystems."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def parameter_count(model_dir: Path, onnx_path: Path) -> int | None:
    """Parameters of the PyTorch model (float tensors of model.pt), else the ONNX model's initializers."""
    if (model_dir / "model.pt").is_file():
        import torch

        state = torch.load(model_dir / "model.pt", map_location="cpu", weights_only=True)
        return sum(v.numel() for v in state.values() if v.is_floating_point())
    model = onnx.load(str(onnx_path))
    floats = [i for i in model.graph.initializer if i.data_type == onnx.TensorProto.FLOAT]
    return sum(math.prod(i.dims) for i in floats) or None


def _described(t: Tensor) -> tuple[str, str, str]:
    """(name, Triton type, ONNX shape with -1 for dynamic axes) of a tensor, for the card."""
    shape = ", ".join("-1" if d is None else str(d) for d in t.dims)
    return t.name, TRITON_TYPES[t.elem_type], f"[{shape}]"


def write_triton(pkg: Path, name: str, max_batch: int) -> list[dict]:
    """triton/<name>{,_int8,_fp16}/: config.pbtxt and 1/model.onnx; what the card says of each."""
    variants = [(name, "fp32", "KIND_AUTO", "model.onnx"),
                (f"{name}_int8", "int8", "KIND_CPU", "model_quant.onnx"),
                (f"{name}_fp16", "fp16 I/O", "KIND_GPU", None)]
    models = []
    for model_name, variant, kind, source in variants:
        target = pkg / "triton" / model_name / "1" / "model.onnx"
        if source:
            link_or_copy(pkg / "onnx" / source, target)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            onnx.save(fp16_io(onnx.load(str(pkg / "onnx" / "model.onnx"))), str(target))
        inputs, outputs = onnx_io(target)
        (pkg / "triton" / model_name / "config.pbtxt").write_text(
            config_pbtxt(model_name, inputs, outputs, max_batch, kind, tensorrt_fp16=variant == "fp16 I/O"),
            encoding="utf-8")
        models.append({"name": model_name, "variant": variant, "kind": kind,
                       "inputs": [_described(t) for t in inputs],
                       "outputs": [_described(t) for t in outputs]})
    return models


def write_trt(pkg: Path, data_jsonl: Path, max_batch: int, max_seconds: float) -> dict:
    """build_trt.sh; the time axis's opt is the test set's median duration, its max --max-seconds."""
    lines = data_jsonl.read_text(encoding="utf-8").splitlines()
    lengths = [json.loads(line).get("source_len", 0) for line in lines if line.strip()]  # 10 ms frames
    opt_s = round(max(1.0, statistics.median(lengths) / 100 if lengths else 1.0), 1)
    seconds = (MIN_SECONDS, min(opt_s, max_seconds), max_seconds)
    front = _yaml(pkg / "onnx" / "config.yaml").get("frontend_conf") or {}
    lfr_n, shift = int(front.get("lfr_n", 1)), float(front.get("frame_shift", 10))
    frames = tuple(model_frames(s, lfr_n, shift) for s in seconds)
    inputs, _ = onnx_io(pkg / "onnx" / "model.onnx")
    shapes = trt_shapes(inputs, frames, (1, min(8, max_batch), max_batch))
    script = pkg / "build_trt.sh"
    script.write_text(build_trt_script("onnx/model.onnx", shapes, seconds), encoding="utf-8")
    script.chmod(0o755)
    return {"min": shapes[0], "opt": shapes[1], "max": shapes[2], "seconds": seconds, "frames": frames}


def write_runtime(pkg: Path) -> None:
    """runtime/local/: the recipe's ONNX runtime, and runtime/requirements.txt with the tested pins."""
    (pkg / "runtime" / "local").mkdir(parents=True)
    for name in RUNTIME_MODULES:
        shutil.copyfile(ROOT / "local" / name, pkg / "runtime" / "local" / name)
    pins = {}
    for line in (ROOT / "constraints.txt").read_text(encoding="utf-8").splitlines():
        name, _, ver = line.partition("==")
        pins[re.sub(r"[-_.]+", "-", name.strip().lower())] = ver.strip()
    lines = [f"{p}=={pins[re.sub(r'[-_.]+', '-', p.lower())]}" for p in RUNTIME_PACKAGES
             if re.sub(r"[-_.]+", "-", p.lower()) in pins]
    header = "# The recipe's tested versions of what runtime/local/onnx_asr.py imports.\n"
    (pkg / "runtime" / "requirements.txt").write_text(header + "\n".join(lines) + "\n", encoding="utf-8")


def data_reports(data_jsonl: Path) -> tuple[dict | None, dict[str, dict]]:
    """data/corpus.json and each set's report.json, found next to the test set (data/<set>/data.jsonl)."""
    data_dir = data_jsonl.resolve().parent.parent
    corpus = read_json(data_dir / "corpus.json")
    names = (corpus or {}).get("sets") or [data_jsonl.resolve().parent.name]
    sets = {n: r for n in names if (r := read_json(data_dir / n / "report.json"))}
    return corpus, sets


def sha256sums(pkg: Path) -> None:
    lines = []
    for path in sorted(p for p in pkg.rglob("*") if p.is_file() and p.name not in ("SHA256SUMS", ".done")):
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        lines.append(f"{h.hexdigest()}  {path.relative_to(pkg)}")
    (pkg / "SHA256SUMS").write_text("\n".join(lines) + "\n", encoding="utf-8")


def write_tarball(pkg: Path, tarball: Path, root: str) -> None:
    """<root>/... of the whole package (hard links kept as links), written then renamed."""
    tmp = tarball.with_name(tarball.name + ".tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        tar.add(pkg, arcname=root, filter=lambda info: None if Path(info.name).name == ".done" else info)
    tmp.replace(tarball)


def build_package(exp_dir: Path, data_jsonl: Path, model_dir: Path, max_batch: int,
                  max_seconds: float) -> Path:
    """Write <exp-dir>/package/ and <exp-dir>/package.tar.gz; returns the package dir."""
    export_dir, pkg = exp_dir / "export", exp_dir / "package"
    parity = check_export(export_dir)
    family = export_family(export_dir)
    shutil.rmtree(pkg, ignore_errors=True)
    (pkg / "onnx").mkdir(parents=True)
    for f in sorted(export_dir.iterdir()):
        if f.is_file() and not f.name.startswith("."):
            shutil.copyfile(f, pkg / "onnx" / f.name)
    config = _yaml(pkg / "onnx" / "config.yaml")
    tokenizer = (config.get("tokenizer_conf") or {}).get("bpemodel")
    tag = re.sub(r"[^A-Za-z0-9_-]", "_", exp_dir.resolve().name)
    triton = write_triton(pkg, tag, max_batch)
    trt = write_trt(pkg, data_jsonl, max_batch, max_seconds)
    write_runtime(pkg)
    copies = {"RESULTS.md": "RESULTS.md", "benchmark.md": "benchmark.md", "benchmark.json": "benchmark.json",
              "config.yaml": "train_config.yaml"}
    for src, dst in copies.items():
        if (exp_dir / src).is_file():
            shutil.copyfile(exp_dir / src, pkg / dst)
    files = {"README.md": "this model card",
             "onnx/model.onnx": "fp32 ONNX model (batch and time axes dynamic)",
             "onnx/model_quant.onnx": "int8 ONNX model (dynamic quantisation of the MatMul weights)",
             "onnx/config.yaml": "model and frontend configuration, in funasr-onnx's form",
             "onnx/am.mvn": "global CMVN of the LFR features", "onnx/tokens.json": "token list",
             "onnx/export.json": "what was exported, with which versions",
             "onnx/parity.json": "ONNX vs PyTorch on the test set"}
    if tokenizer:
        files[f"onnx/{tokenizer}"] = "sentencepiece tokenizer"
    for m in triton:
        files[f"triton/{m['name']}/config.pbtxt"] = f"Triton configuration, {m['variant']}, {m['kind']}"
        files[f"triton/{m['name']}/1/model.onnx"] = f"Triton model file, {m['variant']}"
    files["build_trt.sh"] = "builds a TensorRT fp16 engine with trtexec"
    files.update({f"runtime/local/{n}": "the recipe's ONNX runtime" for n in RUNTIME_MODULES})
    files["runtime/requirements.txt"] = "the runtime's tested package versions"
    what = {"RESULTS.md": "stage 3's scores", "train_config.yaml": "the resolved training config"}
    for dst in copies.values():
        if (pkg / dst).is_file():
            files[dst] = what.get(dst, "the runtime benchmark of stage 5")
    files["SHA256SUMS"] = "checksums of every file"
    card = CardInputs(
        tag=tag, family=family, parameters=parameter_count(model_dir, pkg / "onnx" / "model.onnx"),
        files=files, triton_models=triton, trt=trt, export=read_json(pkg / "onnx" / "export.json") or {},
        parity=parity, train_config=_yaml(pkg / "train_config.yaml") or config,
        results_md=_text(pkg / "RESULTS.md"), benchmark_md=_text(pkg / "benchmark.md"), tokenizer=tokenizer)
    card.corpus, card.sets = data_reports(data_jsonl)
    (pkg / "README.md").write_text(render(card), encoding="utf-8")
    sha256sums(pkg)
    write_tarball(pkg, exp_dir / "package.tar.gz", tag)
    return pkg


def _text(path: Path) -> str | None:
    return path.read_text(encoding="utf-8") if path.is_file() else None


def _yaml(path: Path) -> dict:
    return (yaml.safe_load(path.read_text(encoding="utf-8")) or {}) if path.is_file() else {}


def run(args: argparse.Namespace) -> int:
    exp_dir = args.exp_dir
    model_dir = args.model_dir or exp_dir / "final"
    export_dir = exp_dir / "export"
    check_export(export_dir)
    inputs = [export_dir / ".done", export_dir / "model.onnx", export_dir / "model_quant.onnx",
              args.data_jsonl]
    inputs += [p for p in (exp_dir / "RESULTS.md", exp_dir / "benchmark.json", exp_dir / "config.yaml",
                           model_dir / "model.pt") if p.is_file()]
    inputs += [ROOT / "local" / n for n in RUNTIME_MODULES]
    fp = files_fingerprint(inputs, args.max_batch, args.max_seconds)
    done = exp_dir / "package" / ".done"
    if marker_matches(done, fp) and (exp_dir / "package.tar.gz").is_file():
        log.info("%s: package is done for these inputs; skipping", exp_dir / "package")
        return 0
    pkg = build_package(exp_dir, args.data_jsonl, model_dir, args.max_batch, args.max_seconds)
    done.write_text(fp + "\n", encoding="utf-8")
    size = (exp_dir / "package.tar.gz").stat().st_size / 2**20
    log.info("%s: model card, ONNX, Triton repository, TensorRT script -> %s (%.1f MiB)", pkg,
             exp_dir / "package.tar.gz", size)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--exp-dir", type=Path, required=True, help="exp/<tag> holding export/ (stage 4)")
    parser.add_argument("--data-jsonl", type=Path, required=True, help="stage 0's data.jsonl of a test set")
    parser.add_argument("--model-dir", type=Path, help="PyTorch model dir (default: <exp-dir>/final)")
    parser.add_argument("--max-batch", type=int, default=32,
                        help="Triton's max_batch_size and TensorRT's largest batch")
    parser.add_argument("--max-seconds", type=float, default=30.0,
                        help="longest speech of the TensorRT profile")
    args = parser.parse_args(argv)
    setup_logging()
    if args.max_batch < 1 or args.max_seconds <= MIN_SECONDS:
        parser.error(f"--max-batch must be >= 1 and --max-seconds > {MIN_SECONDS}")
    log.info("Stage 5: package: %s -> %s", args.exp_dir / "export", args.exp_dir / "package")
    return run_stage(run, args)


if __name__ == "__main__":
    sys.exit(main())
