"""Stage 5: a deployable package of an exported model, and its tarball (funasr_recipe/packaging/package.py
says what is in it).

Reads  <exp-dir>/export/ (stage 4, passed), <exp-dir>/final/model.pt, <exp-dir>/config.yaml, RESULTS.md,
       benchmark.{md,json} where present, and <data-jsonl> (a test set: its durations set TensorRT's
       optimal shape; data/corpus.json and data/<set>/report.json next to it describe the data);
writes <exp-dir>/package/ (model card, onnx/, triton/ and triton_gpu/, build_trt.sh, runtime/, SHA256SUMS),
       <exp-dir>/package.tar.gz and <exp-dir>/package/.done (a rerun with the same inputs skips).

  .venv/bin/python -m local.package --exp-dir exp/tiny_sensevoice --data-jsonl data/dev/data.jsonl \\
      [--max-batch 32] [--max-seconds 30]
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from funasr_recipe.core.cli import program_parser, run_main
from funasr_recipe.core.log import setup_logging
from funasr_recipe.dist.markers import fingerprint, is_done, mark_done
from funasr_recipe.packaging.package import MIN_SECONDS, ROOT, build_package, check_export, runtime_files

log = logging.getLogger(__name__)


def run(args: argparse.Namespace) -> None:
    exp_dir = args.exp_dir
    model_dir = args.model_dir or exp_dir / "final"
    export_dir = exp_dir / "export"
    check_export(export_dir)
    inputs = [export_dir / ".done", export_dir / "model.onnx", export_dir / "model_quant.onnx",
              args.data_jsonl]
    inputs += [p for p in (exp_dir / "RESULTS.md", exp_dir / "benchmark.json", exp_dir / "config.yaml",
                           model_dir / "model.pt") if p.is_file()]
    inputs += [ROOT / f for f in runtime_files()]
    fp = fingerprint(args.max_batch, args.max_seconds, files=inputs)
    done = exp_dir / "package" / ".done"
    if is_done(done, fp) and (exp_dir / "package.tar.gz").is_file():
        log.info("%s: package is done for these inputs; skipping", exp_dir / "package")
        return
    pkg = build_package(exp_dir, args.data_jsonl, model_dir, args.max_batch, args.max_seconds)
    mark_done(done, fp)
    size = (exp_dir / "package.tar.gz").stat().st_size / 2**20
    log.info("%s: model card, ONNX, Triton repository, TensorRT script -> %s (%.1f MiB)", pkg,
             exp_dir / "package.tar.gz", size)


def build_parser() -> argparse.ArgumentParser:
    """This program's options (its --help; the docs' reference is made from it)."""
    parser = program_parser(__doc__)
    parser.add_argument("--exp-dir", type=Path, required=True, help="exp/<tag> holding export/ (stage 4)")
    parser.add_argument("--data-jsonl", type=Path, required=True, help="stage 0's data.jsonl of a test set")
    parser.add_argument("--model-dir", type=Path, help="PyTorch model dir (default: <exp-dir>/final)")
    parser.add_argument("--max-batch", type=int, default=32,
                        help="Triton's max_batch_size and TensorRT's largest batch")
    parser.add_argument("--max-seconds", type=float, default=30.0,
                        help="longest speech of the TensorRT profile")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    setup_logging()
    if args.max_batch < 1 or args.max_seconds <= MIN_SECONDS:
        parser.error(f"--max-batch must be >= 1 and --max-seconds > {MIN_SECONDS}")
    log.info("Stage 5: package: %s -> %s", args.exp_dir / "export", args.exp_dir / "package")
    return run_main(lambda: run(args), log)


if __name__ == "__main__":
    sys.exit(main())
