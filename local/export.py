"""Stage 4: ONNX export (fp32 and int8) that funasr-onnx and the recipe's runtime load, checked against
PyTorch on real audio.

Reads  <model-dir> in the hub's layout (stage 3's exp/<tag>/final/) and <data-jsonl>, stage 0's manifest
       of a set (key, source, target, text_language);
writes <out>/{model.onnx, model_quant.onnx, config.yaml, am.mvn, tokens.json, the tokenizer,
       export.json} (funasr_recipe/runtime/export.py), for SenseVoiceSmall sherpa-onnx's metadata in both
       ONNX files and <out>/tokens.txt (funasr_recipe/runtime/sherpa_onnx_export.py), <out>/parity.json
       (PyTorch vs ONNX fp32 vs int8 on the set: funasr_recipe/runtime/parity.py, plus funasr-onnx and
       sherpa-onnx loading the dir) and <out>/.done, the marker of a passed run.

Exits 0 when parity holds, 1 when it is broken (parity.json lists the failures and mismatches), 2 on
bad input. A rerun with the same model and set skips the work; --check-only reruns the parity check
on the ONNX files already in <out> (and adds sherpa-onnx's files to an export made without them). A
sherpa-onnx failure is recorded in parity.json and logged, not gated: it is a runtime to compare with.

  .venv/bin/python -m local.export --model-dir exp/tiny_sensevoice/final --out exp/tiny_sensevoice/export \\
      --data-jsonl data/dev/data.jsonl [--max-utts 200] [--threads 2] [--parity-threads 1] [--check-only]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

from funasr_recipe.compat.lazy_import import install as install_lazy_funasr
from funasr_recipe.core.cli import EXIT_FAILURE, program_parser, run_main
from funasr_recipe.core.env import available_cores
from funasr_recipe.core.fmt import pct
from funasr_recipe.core.log import setup_logging
from funasr_recipe.data.manifest import read_utterances
from funasr_recipe.dist.markers import fingerprint, is_done, mark_done
from funasr_recipe.model.model_dir import load_automodel
from funasr_recipe.runtime.defaults import MAX_INT8_WER_DELTA, MIN_IDENTICAL, PARITY_THREADS
from funasr_recipe.runtime.funasr_onnx_runtime import funasr_onnx_check
from funasr_recipe.runtime.sherpa_onnx_export import FAMILY as SHERPA_FAMILY
from funasr_recipe.runtime.sherpa_onnx_export import missing_sherpa_files, write_sherpa_files
from funasr_recipe.runtime.sherpa_onnx_runtime import sherpa_check

log = logging.getLogger(__name__)
RUNTIME_SMOKE_UTTS = 2  # files funasr-onnx transcribes to show that it loads the export


def run(args: argparse.Namespace) -> int:
    # torch (the exporter, the PyTorch side of parity): seconds, which --help does without.
    from funasr_recipe.runtime.export import export_onnx, family_of, write_export_info, write_runtime_files
    from funasr_recipe.runtime.parity import check_parity

    out, model_dir = args.out, args.model_dir
    for path in (model_dir / "config.yaml", model_dir / "model.pt", args.data_jsonl):
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: stage 4 needs a model dir in the hub's layout "
                                    "(stage 3's exp/<tag>/final) and stage 0's data.jsonl")
    done = out / ".done"
    # What a finished export was made from: the weights, the config, the set and the thresholds.
    fp = fingerprint(args.max_utts, args.min_identical, args.max_int8_wer_delta,
                     files=[model_dir / "model.pt", model_dir / "config.yaml", args.data_jsonl])
    if not args.check_only and is_done(done, fp):
        log.info("%s: export and parity check are done for this model and set; skipping", out)
        return 0
    done.unlink(missing_ok=True)
    utts = read_utterances(args.data_jsonl, args.max_utts)
    automodel = load_automodel(model_dir, "cpu", args.threads)
    family = family_of(automodel.model)
    if args.check_only:
        if not (out / "model.onnx").is_file() or not (out / "model_quant.onnx").is_file():
            raise FileNotFoundError(f"--check-only: no model.onnx and model_quant.onnx in {out}")
        if family == SHERPA_FAMILY and missing_sherpa_files(out):  # an export from before they were written
            write_sherpa_files(out)
    else:
        start = time.perf_counter()
        files = export_onnx(automodel, out) + write_runtime_files(model_dir, automodel, out)
        # Before export.json: the metadata changes the ONNX files' sizes that it records.
        files += [f for f in write_sherpa_files(out) if f not in files]
        seconds = time.perf_counter() - start
        log.info("%s exported in %.1f s: %s", family, seconds,
                 ", ".join(f"{f.name} ({f.stat().st_size / 2**20:.1f} MiB)" for f in files[:2]))
        write_export_info(out, family, model_dir, files, seconds)

    report = check_parity(automodel, out, utts, args.parity_threads, args.min_identical,
                          args.max_int8_wer_delta, desc=f"parity {args.data_jsonl.parent.name}")
    smoke = [u["source"] for u in utts[:RUNTIME_SMOKE_UTTS]]
    report["runtime_check"] = funasr_onnx_check(out, family, smoke, args.threads)
    report["sherpa_onnx_check"] = sherpa = sherpa_check(out, family, smoke, args.threads)
    if sherpa.get("ok") is False:
        log.error("sherpa-onnx does not load %s (recorded in parity.json, not gated): %s", out,
                  sherpa["error"])
    text = json.dumps(report, indent=2, ensure_ascii=False)
    (out / "parity.json").write_text(text + "\n", encoding="utf-8")
    wer = {k: pct(report[k], "n/a") for k in ("wer_torch", "wer_fp32", "wer_int8")}
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
        return EXIT_FAILURE
    mark_done(done, fp)
    log.info("%s: ONNX export passes parity -> %s", family, out)
    return 0


def build_parser() -> argparse.ArgumentParser:
    """This program's options (its --help; the docs' reference is made from it)."""
    parser = program_parser(__doc__)
    parser.add_argument("--model-dir", type=Path, required=True, help="model dir in the hub's layout")
    parser.add_argument("--out", type=Path, required=True, help="export dir to write")
    parser.add_argument("--data-jsonl", type=Path, required=True, help="stage 0's data.jsonl of a test set")
    parser.add_argument("--max-utts", type=int, default=None, help="check the first N utterances only")
    parser.add_argument("--threads", type=int, default=available_cores(),
                        help="torch and onnxruntime threads of the export and of funasr-onnx's and "
                             "sherpa-onnx's load checks (default: the cores this process may use)")
    parser.add_argument("--parity-threads", type=int, default=PARITY_THREADS,
                        help="threads of each side of the parity check, one utterance at a time "
                             "(runtime/parity.py says why 1)")
    parser.add_argument("--min-identical", type=float, default=MIN_IDENTICAL,
                        help="fraction of fp32 transcripts that must equal PyTorch's")
    parser.add_argument("--max-int8-wer-delta", type=float, default=MAX_INT8_WER_DELTA,
                        help="largest allowed |int8 - fp32| error rate (absolute)")
    parser.add_argument("--check-only", action="store_true",
                        help="rerun the parity check on the ONNX files already in --out")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    setup_logging()
    if args.threads < 1 or args.parity_threads < 1:
        parser.error("--threads and --parity-threads must be at least 1")
    import torch

    torch.set_num_threads(args.threads)
    log.info("Stage 4: ONNX export and parity: %s + %s -> %s", args.model_dir, args.data_jsonl, args.out)
    return run_main(lambda: run(args), log)


if __name__ == "__main__":
    install_lazy_funasr()  # before anything imports funasr: compat/lazy_import.py says why
    sys.exit(main())
