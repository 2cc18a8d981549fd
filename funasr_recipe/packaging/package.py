"""Stage 5's deployable package of an exported model, and its tarball.

Reads  <exp-dir>/export/ (stage 4, passed: .done and parity.json), <exp-dir>/final/model.pt (for the
       parameter count), <exp-dir>/config.yaml, RESULTS.md, benchmark.{md,json} where present, and
       <data-jsonl> (a test set: its durations set TensorRT's optimal shape; data/corpus.json and
       data/<set>/report.json next to it describe the data in the card);
writes <exp-dir>/package/
         README.md            model card: data, config, RESULTS, parity, benchmark, how to run it
         onnx/                the export dir as funasr-onnx and the recipe's runtime load it
         triton/              Triton model repository that starts without a GPU: the encoder fp32 and
                              int8 (onnxruntime backend, dynamic batching, dynamic time axis), python
                              models for features and decoding, and ensembles <tag>_asr{,_int8}
                              that take waveforms and return text (packaging/triton_ensemble.py)
         triton_gpu/          the same for the fp16-I/O encoder with TensorRT fp16 (KIND_GPU)
         build_trt.sh         trtexec --fp16 with min/opt/max shapes from the model's inputs
         runtime/             the recipe's ONNX runtime (funasr_recipe/runtime/transcribe.py and the
                              modules it and the Triton python models import, found from the imports)
                              and its requirements
         RESULTS.md, benchmark.{md,json}, train_config.yaml, SHA256SUMS
       <exp-dir>/package.tar.gz  the whole package under <tag>/
       <exp-dir>/package/.done   the marker of a finished run (a rerun with the same inputs skips)

Run local/bench_runtime.py first: the card embeds its table.

  .venv/bin/python -m local.package --exp-dir exp/tiny_sensevoice --data-jsonl data/dev/data.jsonl \\
      [--max-batch 32] [--max-seconds 30]
"""

from __future__ import annotations

import json
import logging
import math
import re
import shutil
import statistics
import tarfile
from importlib import metadata
from pathlib import Path

import onnx
import yaml

from funasr_recipe.core.files import sha256_file
from funasr_recipe.core.imports import imported_modules, local_closure, third_party
from funasr_recipe.core.jsonl import iter_jsonl
from funasr_recipe.core.rejections import BadInputError
from funasr_recipe.model.provenance import model_label, recipe_record
from funasr_recipe.packaging.model_card import CardInputs, read_json, render
from funasr_recipe.packaging.requirements import normalized, pinned, read_pins
from funasr_recipe.packaging.triton_ensemble import PYTHON_MODEL, write_repositories
from funasr_recipe.packaging.triton_repo import build_trt_script, model_frames, onnx_io, trt_shapes
from funasr_recipe.runtime.onnx_asr import export_family

log = logging.getLogger(__name__)
ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "funasr_recipe"
RUNTIME_ENTRY = "funasr_recipe.runtime.transcribe"  # the runtime's command line; it imports the rest
SERVER_ENTRY = "funasr_recipe.serving.cli"  # the HTTP service's command line (stage 6)
SERVER_STATIC = Path("funasr_recipe/serving/static")  # the web page: read by the service, imported by nothing
DEPLOY_DIR = Path("funasr_recipe/packaging/deploy")  # examples of running the package's service
DEPLOY = {"Containerfile": "a container image of the HTTP service (docker/podman build)",
          "asr.service": "a systemd unit of the HTTP service"}
# FastAPI parses multipart uploads with python-multipart, which nothing imports by that name.
UNIMPORTED_REQUIREMENTS = ("python-multipart",)
MIN_SECONDS = 0.1  # shortest speech in the TensorRT profile


def check_export(export_dir: Path) -> dict:
    """parity.json of a finished, passing stage-4 export; FileNotFoundError/ValueError otherwise."""
    for name in ("model.onnx", "model_quant.onnx", "config.yaml", "am.mvn", "parity.json", ".done"):
        if not (export_dir / name).is_file():
            raise FileNotFoundError(f"{export_dir / name} not found: run stage 4 (local/export.py) first")
    parity = json.loads((export_dir / "parity.json").read_text(encoding="utf-8"))
    if not parity.get("pass"):
        raise BadInputError(f"{export_dir / 'parity.json'}: the export failed its parity check; "
                            "not packaging it")
    return parity


def parameter_count(model_dir: Path, onnx_path: Path) -> int | None:
    """Parameters of the PyTorch model (float tensors of model.pt), else the ONNX model's initializers."""
    if (model_dir / "model.pt").is_file():
        import torch

        state = torch.load(model_dir / "model.pt", map_location="cpu", weights_only=True)
        return sum(v.numel() for v in state.values() if v.is_floating_point())
    model = onnx.load(str(onnx_path))
    floats = [i for i in model.graph.initializer if i.data_type == onnx.TensorProto.FLOAT]
    return sum(math.prod(i.dims) for i in floats) or None


def write_trt(pkg: Path, data_jsonl: Path, max_batch: int, max_seconds: float) -> dict:
    """build_trt.sh; the time axis's opt is the test set's median duration, its max --max-seconds."""
    lengths = [obj.get("source_len", 0) for _, obj in iter_jsonl(data_jsonl)]  # 10 ms frames
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


def runtime_files() -> list[Path]:
    """The recipe's files the package's runtime/ holds (repository-relative): RUNTIME_ENTRY, the modules of
    the package that the Triton python models import, and every module of the package these import, found
    from the imports, so that the copy runs without the recipe."""
    roots = [RUNTIME_ENTRY, SERVER_ENTRY,
             *sorted(m for m in imported_modules(PYTHON_MODEL) if m.startswith(PACKAGE + "."))]
    modules = {p.relative_to(ROOT) for m in roots for p in local_closure(ROOT, m, PACKAGE)}
    return sorted(modules | {p.relative_to(ROOT) for p in (ROOT / SERVER_STATIC).iterdir() if p.is_file()})


def runtime_requirements(files: list[Path]) -> list[str]:
    """``name==version`` of every distribution the runtime files import and of everything those
    require, at the recipe's tested pins (packaging/requirements.py)."""
    pins = read_pins(ROOT / "constraints.txt")
    distributions = metadata.packages_distributions()
    names = {d for module in third_party([ROOT / f for f in files if f.suffix == ".py"], PACKAGE)
             for d in distributions.get(module, [module])} | set(UNIMPORTED_REQUIREMENTS)
    # Modules no distribution here provides (Triton's python backend brings its own) are not pinned.
    return pinned(sorted(n for n in names if normalized(n) in pins), ROOT / "constraints.txt")


def write_runtime(pkg: Path) -> list[Path]:
    """runtime/: the recipe's ONNX runtime, and runtime/requirements.txt with the tested pins; returns the
    runtime's files (relative to runtime/)."""
    files = runtime_files()
    for f in files:
        (pkg / "runtime" / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / f, pkg / "runtime" / f)
    header = (f"# The recipe's tested versions of what runtime/ imports (python -m {RUNTIME_ENTRY}, "
              f"python -m {SERVER_ENTRY} and the Triton python models).\n")
    (pkg / "runtime" / "requirements.txt").write_text(header + "\n".join(runtime_requirements(files)) + "\n",
                                                      encoding="utf-8")
    return files


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
        lines.append(f"{sha256_file(path)}  {path.relative_to(pkg)}")
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
    triton, triton_files = write_repositories(pkg, tag, family, max_batch)
    trt = write_trt(pkg, data_jsonl, max_batch, max_seconds)
    runtime = write_runtime(pkg)
    (pkg / "deploy").mkdir(exist_ok=True)
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
    if (pkg / "onnx" / "tokens.txt").is_file():
        files["onnx/tokens.txt"] = "sherpa-onnx's token table (the ONNX files hold its metadata)"
    files.update(triton_files)
    files["build_trt.sh"] = "builds a TensorRT fp16 engine with trtexec"
    files.update({f"runtime/{f}": "the recipe's ONNX runtime" for f in runtime})
    files["runtime/requirements.txt"] = "the runtime's tested package versions, every one pinned"
    for name, what in DEPLOY.items():
        shutil.copyfile(ROOT / DEPLOY_DIR / name, pkg / "deploy" / name)
        files[f"deploy/{name}"] = what
    what = {"RESULTS.md": "stage 3's scores", "train_config.yaml": "the resolved training config"}
    for dst in copies.values():
        if (pkg / dst).is_file():
            files[dst] = what.get(dst, "the runtime benchmark of stage 5")
    files["SHA256SUMS"] = "checksums of every file"
    card = CardInputs(
        tag=tag, family=family, parameters=parameter_count(model_dir, pkg / "onnx" / "model.onnx"),
        files=files, triton_models=triton, trt=trt, export=read_json(pkg / "onnx" / "export.json") or {},
        parity=parity, train_config=_yaml(pkg / "train_config.yaml") or config,
        results_md=_text(pkg / "RESULTS.md"), benchmark_md=_text(pkg / "benchmark.md"), tokenizer=tokenizer,
        trained=trained_as(model_dir))
    card.corpus, card.sets = data_reports(data_jsonl)
    (pkg / "README.md").write_text(render(card), encoding="utf-8")
    sha256sums(pkg)
    write_tarball(pkg, exp_dir / "package.tar.gz", tag)
    return pkg


def trained_as(model_dir: Path) -> str | None:
    """The card's "trained" line: the model dir's name in results (model/provenance.py) and the config its
    run used; None for a model dir this recipe did not make."""
    record = recipe_record(model_dir)
    if not record or "checkpoint" not in record:
        return None
    config = f"; config `{record['config']}`" if record.get("config") else ""
    return f"{model_label(model_dir, model_dir.parent.name)}{config}"


def _text(path: Path) -> str | None:
    return path.read_text(encoding="utf-8") if path.is_file() else None


def _yaml(path: Path) -> dict:
    return (yaml.safe_load(path.read_text(encoding="utf-8")) or {}) if path.is_file() else {}
