"""Stage 4: ONNX export (fp32 and int8) that funasr-onnx loads, checked against PyTorch on real audio.

Reads  <model-dir> in the hub's layout (config.yaml, model.pt, am.mvn, tokenizer, configuration.json:
       local/make_model_dir.py's output, e.g. stage 3's exp/<tag>/final/) and <data-jsonl>, stage 0's
       index of a test set (key, source, target, text_language);
writes <out>/model.onnx          fp32, batch and time axes dynamic
       <out>/model_quant.onnx    int8: dynamic quantisation of the MatMul weights, funasr's settings
       <out>/config.yaml, am.mvn, tokens.json and the tokenizer (chn_jpn_yue_eng_ko_spectok.bpe.model
                                 for SenseVoiceSmall, else the model's own): what funasr_onnx's
                                 SenseVoiceSmall and Paraformer, and local/conformer_ctc_onnx.py, load
       <out>/parity.json         PyTorch vs ONNX fp32 vs int8 on the set (local/onnx_parity.py)
       <out>/export.json, .done  what was exported, with which versions; the marker of a passed run

SenseVoiceSmall and Paraformer go through funasr's own export (AutoModel.export: the model's export()
and funasr.utils.export_utils, which also quantises); ConformerCTC through the same path, which calls
its export() in local/models.py. funasr's export writes the two .onnx files only. funasr-onnx reads the
rest from the same dir and needs it in its own form, unlike a model dir's:
  - Paraformer: config.yaml's frontend_conf must not hold cmvn_file (funasr-onnx passes am.mvn itself:
    TypeError "multiple values for keyword argument 'cmvn_file'"); the hub's configs have none, ours do;
  - Paraformer with a sentencepiece tokenizer: ``lang: en-bpe``, or its post-processing raises
    "invalid character" on the pieces' "▁" and never returns a transcript;
  - SenseVoiceSmall: the sentencepiece model under the released name, whatever the model dir calls it;
  - both: an am.mvn, even for a model without global CMVN (an identity one is written then), and
    frontend_conf.dither: 0.0, as funasr-onnx's frontend otherwise adds random noise to every input.

Exits 0 when parity holds, 1 when it is broken (parity.json lists the failures and mismatches), 2 on
bad input. A rerun with the same model and set skips the work; --check-only reruns the parity check
on the ONNX files already in <out>.

  python -m local.export --model-dir exp/tiny_sensevoice/final --out exp/tiny_sensevoice/export \\
      --data-jsonl data/dev/data.jsonl [--max-utts 200] [--threads 2] [--check-only]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf

from local.bad_input import run_stage
from local.dist_slice import files_fingerprint, marker_matches
from local.log_utils import setup_logging
from local.onnx_parity import MAX_INT8_WER_DELTA, MIN_IDENTICAL, check_parity, family_of, read_utterances

log = logging.getLogger(__name__)
OPSET = 14  # funasr's default
RUNTIME_SMOKE_UTTS = 2


def default_threads() -> int:
    """The cores this process may run on (taskset and cpusets count; os.cpu_count() sees every core)."""
    return len(os.sched_getaffinity(0))


@contextlib.contextmanager
def legacy_onnx_exporter() -> Iterator[None]:
    """``torch.onnx.export`` with ``dynamo=False`` for the duration of the block.

    torch 2.9 made the dynamo exporter the default; it needs onnxscript and fails on Paraformer.
    funasr's export_utils calls ``torch.onnx.export`` without the argument, so the default is changed
    here, and only while exporting, rather than patching funasr.
    """
    original = torch.onnx.export
    torch.onnx.export = functools.partial(original, dynamo=False)
    try:
        yield
    finally:
        torch.onnx.export = original


def load_model(model_dir: Path, threads: int) -> Any:
    """funasr's AutoModel on a local model dir (no hub), with the recipe's model classes registered."""
    from funasr import AutoModel

    import local.models  # noqa: F401  (registers ConformerCTC)

    # ncpu: AutoModel otherwise sets 4 torch threads, whatever the machine has.
    return AutoModel(model=str(model_dir), device="cpu", disable_update=True, disable_pbar=True,
                     disable_log=True, ncpu=threads)


def export_onnx(automodel: Any, out: Path) -> list[Path]:
    """model.onnx and model_quant.onnx through funasr's export (the model's export() + export_utils)."""
    family_of(automodel.model)  # fail before exporting a class funasr-onnx could not run
    out.mkdir(parents=True, exist_ok=True)
    # The quantiser logs one INFO line per tensor (thousands for SenseVoiceSmall).
    logging.disable(logging.INFO)
    try:
        with legacy_onnx_exporter():
            automodel.export(type="onnx", quantize=True, output_dir=str(out), device="cpu",
                             opset_version=OPSET)
    finally:
        logging.disable(logging.NOTSET)
    files = [out / "model.onnx", out / "model_quant.onnx"]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise RuntimeError(f"funasr's export wrote no {', '.join(missing)} in {out}")
    return files


def _vocabulary(tokenizer: Any) -> list[str]:
    if hasattr(tokenizer, "sp"):  # funasr's SentencepiecesTokenizer
        return [tokenizer.sp.IdToPiece(i) for i in range(tokenizer.sp.GetPieceSize())]
    return list(tokenizer.token_list)


def write_runtime_files(model_dir: Path, automodel: Any, out: Path) -> list[Path]:
    """config.yaml, am.mvn, tokens.json and the tokenizer in the form funasr-onnx reads (module docstring)."""
    from local.cmvn import write_am_mvn
    from local.make_tokenizer import model_file_name

    family = family_of(automodel.model)
    cfg = OmegaConf.load(model_dir / "config.yaml")
    frontend, tokenizer = automodel.kwargs["frontend"], automodel.kwargs["tokenizer"]
    cfg.frontend_conf.pop("cmvn_file", None)
    cfg.frontend_conf.dither = 0.0
    if getattr(frontend, "cmvn_file", None):
        shutil.copyfile(frontend.cmvn_file, out / "am.mvn")
    else:  # funasr-onnx always applies am.mvn: shift 0, scale 1 leaves the features as PyTorch sees them
        dim = frontend.output_size()
        write_am_mvn(out / "am.mvn", np.zeros(dim), np.ones(dim))
    files = [out / "config.yaml", out / "am.mvn", out / "tokens.json"]
    bpemodel = getattr(tokenizer, "bpemodel", None)
    if bpemodel:
        name = model_file_name("sensevoice") if family == "SenseVoiceSmall" else Path(bpemodel).name
        shutil.copyfile(bpemodel, out / name)
        cfg.tokenizer_conf.bpemodel = name
        files.append(out / name)
        if family == "Paraformer" and "lang" not in cfg:
            cfg.lang = "en-bpe"  # funasr-onnx's post-processing for sentencepiece pieces
    elif OmegaConf.select(cfg, "tokenizer_conf.token_list"):
        cfg.tokenizer_conf.token_list = "tokens.json"
    tokens = json.dumps(_vocabulary(tokenizer), ensure_ascii=False, indent=0)
    (out / "tokens.json").write_text(tokens + "\n", encoding="utf-8")
    OmegaConf.save(cfg, out / "config.yaml")
    return files


def load_runtime(out: Path, family: str, quantize: bool, threads: int, batch_size: int = 1) -> Any:
    """The deployment runtime on an export dir: funasr-onnx's class, or the recipe's for ConformerCTC."""
    if family == "ConformerCTC":
        from local.conformer_ctc_onnx import ConformerCTCOnnx as runtime
    else:
        import funasr_onnx

        runtime = getattr(funasr_onnx, family)
    return runtime(str(out), batch_size=batch_size, quantize=quantize, intra_op_num_threads=threads)


def runtime_text(result: Any) -> str:
    """The transcript in one result of a runtime: a str, or Paraformer's {"preds": (text, words)}."""
    return result["preds"][0] if isinstance(result, dict) else result


def runtime_check(out: Path, family: str, sources: list[str], threads: int) -> dict:
    """Load the export dir as a deployment would, fp32 and int8, and transcribe a few files with it."""
    report = {"runtime": "local.conformer_ctc_onnx" if family == "ConformerCTC" else f"funasr_onnx.{family}"}
    for name, quantize in (("fp32", False), ("int8", True)):
        runtime = load_runtime(out, family, quantize, threads)
        report[name] = [runtime_text(r) for r in runtime(sources)]
    return report


def _versions() -> dict[str, str]:
    from importlib.metadata import version

    return {p: version(p) for p in ("torch", "funasr", "onnx", "onnxruntime", "funasr-onnx")}


def run(args: argparse.Namespace) -> int:
    out, model_dir = args.out, args.model_dir
    for path in (model_dir / "config.yaml", model_dir / "model.pt", args.data_jsonl):
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: stage 4 needs a model dir in the hub's layout "
                                    "(stage 3's exp/<tag>/final) and stage 0's data.jsonl")
    done = out / ".done"
    # What a finished export was made from: the weights, the config, the set and the thresholds.
    fp = files_fingerprint([model_dir / "model.pt", model_dir / "config.yaml", args.data_jsonl],
                           args.max_utts, args.min_identical, args.max_int8_wer_delta)
    if not args.check_only and marker_matches(done, fp):
        log.info("%s: export and parity check are done for this model and set; skipping", out)
        return 0
    done.unlink(missing_ok=True)
    utts = read_utterances(args.data_jsonl, args.max_utts)
    automodel = load_model(model_dir, args.threads)
    family = family_of(automodel.model)
    if args.check_only:
        if not (out / "model.onnx").is_file() or not (out / "model_quant.onnx").is_file():
            raise FileNotFoundError(f"--check-only: no model.onnx and model_quant.onnx in {out}")
    else:
        start = time.perf_counter()
        files = export_onnx(automodel, out) + write_runtime_files(model_dir, automodel, out)
        seconds = time.perf_counter() - start
        log.info("%s exported in %.1f s: %s", family, seconds,
                 ", ".join(f"{f.name} ({f.stat().st_size / 2**20:.1f} MiB)" for f in files[:2]))
        (out / "export.json").write_text(json.dumps({
            "family": family, "model_dir": str(model_dir.resolve()), "opset": OPSET,
            "quantization": "onnxruntime quantize_dynamic: MatMul weights, per channel, QUInt8 (funasr's)",
            "files": {f.name: f.stat().st_size for f in files}, "export_seconds": round(seconds, 1),
            "versions": _versions()}, indent=2) + "\n", encoding="utf-8")

    report = check_parity(automodel, out, utts, args.threads, args.min_identical, args.max_int8_wer_delta,
                          desc=f"parity {args.data_jsonl.parent.name}")
    report["runtime_check"] = runtime_check(out, family, [u["source"] for u in utts[:RUNTIME_SMOKE_UTTS]],
                                            args.threads)
    text = json.dumps(report, indent=2, ensure_ascii=False)
    (out / "parity.json").write_text(text + "\n", encoding="utf-8")
    wer = {k: "n/a" if report[k] is None else f"{report[k]:.2%}"
           for k in ("wer_torch", "wer_fp32", "wer_int8")}
    log.info("parity on %d utterances: fp32 identical to PyTorch %.1f%%, int8 %.1f%%; max |log-prob diff| "
             "fp32 %.2e, int8 %.2e; error rate torch %s, fp32 %s, int8 %s", report["utterances"],
             100 * report["identical_fraction"], 100 * report["identical_fraction_int8"],
             report["max_abs_logit_diff"], report["max_abs_logit_diff_int8"],
             wer["wer_torch"], wer["wer_fp32"], wer["wer_int8"])
    if not report["pass"]:
        for failure in report["failures"]:
            log.error("parity broken: %s", failure)
        log.error("%s: the export does not reproduce the PyTorch model; see its mismatches. Do not deploy "
                  "it: check the versions in export.json against requirements.txt and rerun stage 4",
                  out / "parity.json")
        return 1
    done.write_text(fp + "\n", encoding="utf-8")
    log.info("%s: ONNX export passes parity -> %s", family, out)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path, required=True, help="model dir in the hub's layout")
    parser.add_argument("--out", type=Path, required=True, help="export dir to write")
    parser.add_argument("--data-jsonl", type=Path, required=True, help="stage 0's data.jsonl of a test set")
    parser.add_argument("--max-utts", type=int, default=None, help="check the first N utterances only")
    parser.add_argument("--threads", type=int, default=default_threads(),
                        help="torch and onnxruntime threads (default: the cores this process may use)")
    parser.add_argument("--min-identical", type=float, default=MIN_IDENTICAL,
                        help="fraction of fp32 transcripts that must equal PyTorch's")
    parser.add_argument("--max-int8-wer-delta", type=float, default=MAX_INT8_WER_DELTA,
                        help="largest allowed |int8 - fp32| error rate (absolute)")
    parser.add_argument("--check-only", action="store_true",
                        help="rerun the parity check on the ONNX files already in --out")
    args = parser.parse_args(argv)
    setup_logging()
    if args.threads < 1:
        parser.error("--threads must be at least 1")
    torch.set_num_threads(args.threads)
    log.info("Stage 4: ONNX export and parity: %s + %s -> %s", args.model_dir, args.data_jsonl, args.out)
    return run_stage(run, args)


if __name__ == "__main__":
    sys.exit(main())
