"""Stage 2: training curves from funasr's training log, during or after training
(funasr_recipe/reports/curves.py).

Reads  exp/<tag>/train.log (the trainer's log lines, as run.sh tees them; rank 0's lines are used:
funasr's train/validate lines and the recipe hook's ``train_metrics: {json}`` lines where present);
writes <out>.png (train loss per logged step with validation loss per epoch, learning rate, utt/s and
frames/s of rank 0, data-wait fraction, accuracy as funasr names it: acc or SenseVoice's acc_rich)
and <out>.tsv (the parsed points). A log from before the train_metrics hook still plots.

  .venv/bin/python -m local.plot_training exp/tiny_sensevoice/train.log --out exp/tiny_sensevoice/curves
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from funasr_recipe.core.cli import program_parser, run_main
from funasr_recipe.core.log import setup_logging
from funasr_recipe.core.rejections import BadInputError
from funasr_recipe.reports.curves import parse_log, plot

log = logging.getLogger(__name__)


def run(args: argparse.Namespace) -> None:
    if not args.log.is_file():
        raise FileNotFoundError(f"no training log at {args.log}")
    curves = parse_log(args.log)
    if not curves.step and not curves.val_loss:
        raise BadInputError(f"{args.log} has no training or validation lines of rank 0 yet")
    if not curves.step:
        log.warning("%s: no training lines of rank 0 (train_conf.log_interval is larger than the steps "
                    "so far); plotting the validation loss only", args.log)
    out = args.out or args.log.parent / "curves"
    plot(curves, out, f"{args.log.parent.name}: {len(curves.step)} logged steps, "
                      f"{len(curves.val_loss)} validations")
    log.info("%s: %d train points, %d train_metrics points, validation loss by epoch %s -> %s.png",
             args.log, len(curves.step), len(curves.metric_step), [round(v, 3) for v in curves.val_loss], out)
    if not curves.metric_step:
        log.info("%s: no train_metrics lines (a log from before the trainer hook): throughput and data "
                 "wait are not plotted", args.log)


def build_parser() -> argparse.ArgumentParser:
    """This program's options (its --help; the docs' reference is made from it)."""
    parser = program_parser(__doc__)
    parser.add_argument("log", type=Path, help="funasr training log (exp/<tag>/train.log)")
    parser.add_argument("--out", type=Path, help="output path without suffix (default: <log dir>/curves)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging()
    return run_main(lambda: run(args), log)


if __name__ == "__main__":
    sys.exit(main())
