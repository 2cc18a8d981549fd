"""Transcribe audio files with an export dir on the recipe's ONNX runtime: one ``path<TAB>text`` line each.

Reads  an export dir (stage 4's exp/<tag>/export, or a package's onnx/) and audio files (any rate and
       channel count soundfile reads); writes the texts to stdout. Shipped in every package's runtime/.

  python -m funasr_recipe.runtime.transcribe exp/tiny_sensevoice/export a.wav b.wav [--int8]
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from funasr_recipe.core.cli import run_main
from funasr_recipe.core.env import available_cores
from funasr_recipe.core.log import setup_logging
from funasr_recipe.runtime.onnx_asr import OnnxASR

log = logging.getLogger(__name__)


def transcribe(args: argparse.Namespace) -> None:
    asr = OnnxASR(args.export_dir, quantize=args.int8, threads=args.threads, batch_size=args.batch_size,
                  device=args.device)
    for path, text in zip(args.audio, asr(args.audio), strict=True):
        print(f"{path}\t{text}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("export_dir", type=Path, help="export dir (stage 4) or a package's onnx/")
    parser.add_argument("audio", nargs="+", help="audio files (any rate and channel count soundfile reads)")
    parser.add_argument("--int8", action="store_true", help="model_quant.onnx instead of model.onnx")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--threads", type=int, default=available_cores(), help="default: the cores available")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:i] (onnxruntime-gpu)")
    args = parser.parse_args(argv)
    setup_logging()
    return run_main(lambda: transcribe(args), log)


if __name__ == "__main__":
    sys.exit(main())
