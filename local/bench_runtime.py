"""Stage 5: latency, throughput and RTF of each runtime on a test set (funasr_recipe/runtime/benchmark.py
says what is measured and how).

Reads  <exp-dir>/export/ (stage 4; with its tokens.txt and ONNX metadata for the sherpa-onnx rows),
       <exp-dir>/final/ (the PyTorch model dir; --model-dir for another) and <data-jsonl>, stage 0's
       manifest of a test set (its audio files are the input);
writes <exp-dir>/benchmark.json  every row, the machine, load and versions
       <exp-dir>/benchmark.md    the same as the table a deployment engineer compares runtimes with
       <exp-dir>/.benchmark.done the marker of a finished run (a rerun with the same inputs skips)
The recipe's own performance targets are bench/bench_runtime.py's business, not the user's run: only
with --targets are they judged (in both files, and a MISSED one is a warning), and with --strict a MISSED
one is exit 1. run.sh's stage 5 passes neither.

  .venv/bin/python -m local.bench_runtime --exp-dir exp/tiny_sensevoice --data-jsonl data/dev/data.jsonl \\
      [--max-utts 100] [--threads 2] [--batch-sizes 1,8,32] [--repeats 1] [--targets] [--strict]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from funasr_recipe.compat.lazy_import import install as install_lazy_funasr
from funasr_recipe.core.cli import EXIT_FAILURE, program_parser, run_main
from funasr_recipe.core.env import available_cores, cpu_name, versions
from funasr_recipe.core.log import setup_logging
from funasr_recipe.dist.markers import fingerprint, is_done, mark_done
from funasr_recipe.model.provenance import describe_model_dir
from funasr_recipe.runtime.benchmark import benchmark_set, markdown, run_benchmark, targets
from funasr_recipe.runtime.funasr_onnx_runtime import FUNASR_ONNX_FAMILIES

log = logging.getLogger(__name__)


def run(args: argparse.Namespace) -> int:
    export_dir, model_dir = args.exp_dir / "export", args.model_dir or args.exp_dir / "final"
    for path, what in ((export_dir / "model.onnx", "stage 4's export"), (model_dir / "model.pt", "stage 3's "
                       "model dir"), (args.data_jsonl, "stage 0's data.jsonl")):
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found ({what}): run the earlier stages first")
    devices = ["cpu"]
    import torch

    if torch.cuda.is_available() and not args.cpu_only:
        devices.append("cuda")
    inputs = [export_dir / "model.onnx", export_dir / "model_quant.onnx", model_dir / "model.pt",
              args.data_jsonl]
    # tokens.txt by content, absent or not: the sherpa-onnx rows read it (stage 4 writes it for SenseVoice).
    # (--targets only where given: stage 5's fingerprint stays what it was before the option)
    judged = ["targets"] if args.targets else []
    fp = fingerprint(args.max_utts, args.threads, args.batch_sizes, args.repeats, devices, *judged,
                     files=inputs, contents=[export_dir / "tokens.txt"])
    done = args.exp_dir / ".benchmark.done"
    if is_done(done, fp) and (args.exp_dir / "benchmark.json").is_file():
        log.info("%s: benchmark is done for these inputs; skipping", args.exp_dir / "benchmark.md")
        return 0
    done.unlink(missing_ok=True)
    utts, audio_s = benchmark_set(args.data_jsonl, args.max_utts)
    load_before = os.getloadavg()
    report = run_benchmark(export_dir, model_dir, utts, audio_s, args.batch_sizes, devices, args.threads,
                           args.repeats)
    family = report["family"]
    report = {"tag": args.exp_dir.name, "exp_dir": str(args.exp_dir), "export_dir": str(export_dir),
              "model_dir": str(model_dir), "model": describe_model_dir(model_dir),
              "data_jsonl": str(args.data_jsonl), "utterances": len(utts),
              "audio_seconds": round(audio_s, 3), "threads": args.threads, "repeats": args.repeats,
              "batch_sizes": args.batch_sizes, "devices": devices,
              "funasr_onnx": f"funasr_onnx.{family}" if family in FUNASR_ONNX_FAMILIES else None,
              "machine": {"cpu": cpu_name(), "cores_available": available_cores(), "cores": os.cpu_count(),
                          "load_before": [round(x, 2) for x in load_before],
                          "load_after": [round(x, 2) for x in os.getloadavg()],
                          "gpu": torch.cuda.get_device_name(0) if "cuda" in devices else None},
              "versions": versions("torch", "funasr", "onnxruntime", "funasr-onnx", "sherpa-onnx"), **report}
    if args.targets:
        report["targets"] = targets(report["rows"])
    (args.exp_dir / "benchmark.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    text = markdown(report)
    (args.exp_dir / "benchmark.md").write_text(text, encoding="utf-8")
    sys.stderr.write(text)
    mark_done(done, fp)
    missed = [t["name"] for t in report.get("targets", ()) if t["ok"] is False]
    if missed:
        log.warning("targets MISSED in this run: %s (see %s)", ", ".join(missed),
                    args.exp_dir / "benchmark.md")
    return EXIT_FAILURE if missed and args.strict else 0


def build_parser() -> argparse.ArgumentParser:
    """This program's options (its --help; the docs' reference is made from it)."""
    parser = program_parser(__doc__)
    parser.add_argument("--exp-dir", type=Path, required=True, help="exp/<tag>: reads export/, writes "
                        "benchmark.{md,json}")
    parser.add_argument("--data-jsonl", type=Path, required=True, help="stage 0's data.jsonl of a test set")
    parser.add_argument("--model-dir", type=Path, help="PyTorch model dir (default: <exp-dir>/final)")
    parser.add_argument("--max-utts", type=int, default=100,
                        help="N utterances spread over the set (0: all); bench/bench_runtime.py runs 200")
    parser.add_argument("--threads", type=int, default=available_cores(),
                        help="threads of every runtime (default: the cores this process may use)")
    parser.add_argument("--batch-sizes", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32],
                        help="comma-separated batch sizes")
    parser.add_argument("--repeats", type=int, default=1, help="timed passes over the set per row")
    parser.add_argument("--cpu-only", action="store_true", help="no CUDA rows even where CUDA is present")
    parser.add_argument("--targets", action="store_true",
                        help="judge the rows against the benchmark's performance targets "
                        "(funasr_recipe/runtime/benchmark.py TARGETS; bench/bench_runtime.py)")
    parser.add_argument("--strict", action="store_true",
                        help="with --targets: exit 1 when a target is MISSED")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    setup_logging()
    if args.threads < 1 or args.repeats < 1 or min(args.batch_sizes) < 1:
        parser.error("--threads, --repeats and the batch sizes must be at least 1")
    if args.strict and not args.targets:
        parser.error("--strict judges the targets: give --targets too")
    args.max_utts = args.max_utts or None
    log.info("Stage 5: runtime benchmark: %s + %s -> %s", args.exp_dir / "export", args.data_jsonl,
             args.exp_dir / "benchmark.md")
    return run_main(lambda: run(args), log)


if __name__ == "__main__":
    install_lazy_funasr()  # before anything imports funasr: compat/lazy_import.py says why
    sys.exit(main())
