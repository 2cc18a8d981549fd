"""Stage 2's last step: a checkpoint of a training run as a model dir in the hub's format.

Reads  <exp-dir>/config.yaml and the checkpoint (fp32 weights; funasr_recipe/model/model_dir.py);
writes <out> (default <exp-dir>/best_model): model.pt, config.yaml, am.mvn, the tokenizer,
       configuration.json, loadable by funasr's AutoModel and as --pretrained-dir for a fine-tune.
The checkpoint is loaded weights-only (funasr_recipe/model/checkpoint.py): a pickle that would run code is
refused (exit 2).

  .venv/bin/python -m local.make_model_dir --exp-dir exp/tiny_sensevoice --checkpoint model.pt.best
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from funasr_recipe.core.cli import program_parser, run_main
from funasr_recipe.core.log import setup_logging
from funasr_recipe.model.model_dir import make_model_dir

log = logging.getLogger(__name__)


def run(args: argparse.Namespace) -> None:
    out = make_model_dir(args.exp_dir, args.checkpoint, args.out or args.exp_dir / "best_model")
    log.info("%s: model dir in the hub's format from %s", out, args.exp_dir / args.checkpoint)


def build_parser() -> argparse.ArgumentParser:
    """This program's options (its --help; the docs' reference is made from it)."""
    parser = program_parser(__doc__)
    parser.add_argument("--exp-dir", type=Path, required=True)
    parser.add_argument("--checkpoint", default="model.pt.best",
                        help="checkpoint under --exp-dir: a DeepSpeed tag dir or a state-dict file")
    parser.add_argument("--out", type=Path, help="the model dir to write (default: <exp-dir>/best_model)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging()
    return run_main(lambda: run(args), log)


if __name__ == "__main__":
    sys.exit(main())
