"""Stage 3: the final model of a training run: the fp32 average of its best checkpoints by validation
loss, unless that average is worse on the validation set than the best checkpoint alone.

Reads  <exp-dir>/model.pt (the validation loss of every kept checkpoint), <exp-dir>/config.yaml (how many
       to average: train_conf.avg_nbest_model, unless --num or an override after -- says; the validation
       set), the chosen checkpoints (fp32 master weights, not funasr's bf16 copies) and the validation set;
writes <exp-dir>/model.pt.avg<k> (the k checkpoints averaged; every other model.pt.avg<n>, funasr's own
       end-of-training average included, is removed) and <final-dir> (default <exp-dir>/final): the average,
       or the best checkpoint when the average's validation loss is higher, as a model dir in the hub's
       format, which decoding and export read (and <final-dir>/.done with --done-fingerprint). Its
       configuration.json "recipe" records the checkpoints averaged, those left out and why, and both
       validation losses with the choice (funasr_recipe/model/averaging.py has the rule).
Every checkpoint is loaded weights-only, DeepSpeed's shards included: one that holds anything but tensors,
containers and DeepSpeed's few data classes is refused (exit 2) before it can run code
(funasr_recipe/model/checkpoint.py says where a library loads otherwise).

  .venv/bin/python -m local.average --exp-dir exp/tiny_sensevoice --device cpu \\
      -- ++train_conf.avg_nbest_model=3
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import yaml
from omegaconf import OmegaConf

from funasr_recipe.compat.lazy_import import install as install_lazy_funasr
from funasr_recipe.core.cli import program_parser, run_main, split_overrides, str2bool
from funasr_recipe.core.log import setup_logging
from funasr_recipe.core.rejections import BadInputError
from funasr_recipe.dist.markers import mark_done
from funasr_recipe.model.defaults import LOSS_MARGIN

log = logging.getLogger(__name__)

# The trainer's keys stage 3 reads from the overrides; the others are stage 2's (already in config.yaml).
NUM_KEY = "train_conf.avg_nbest_model"


def override_value(overrides: list[str], key: str) -> str | None:
    """The value the last Hydra-style override of ``key`` gives (``++k=v``, ``+k=v``, ``k=v``), or None;
    ``~k`` (delete) gives None."""
    value = None
    for override in overrides:
        name, sep, given = override.partition("=")
        if name == f"~{key}":
            value = None
        elif sep and name.lstrip("+") == key:
            value = given
    return value


def checkpoint_count(exp_dir: Path, num: int | None, overrides: list[str]) -> int:
    """How many checkpoints to average: --num, else the overrides' train_conf.avg_nbest_model (the user's
    at stage 3 win over stage 2's config), else <exp-dir>/config.yaml's, else 5."""
    if num is not None:
        source, value = "--num", num
    elif (given := override_value(overrides, NUM_KEY)) is not None:
        source = f"++{NUM_KEY}={given}"
        try:
            value = yaml.safe_load(given)
        except yaml.YAMLError:
            value = given
    else:
        config = exp_dir / "config.yaml"
        if not config.is_file():
            raise FileNotFoundError(f"{config}: no resolved config; has stage 2 run in {exp_dir}?")
        source, value = f"{config} {NUM_KEY}", OmegaConf.select(OmegaConf.load(config), NUM_KEY, default=5)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise BadInputError(f"{source}: the number of checkpoints to average must be a positive integer")
    log.info("averaging up to %d checkpoints (%s)", value, source)
    return value


def run(args: argparse.Namespace, overrides: list[str]) -> None:
    from funasr_recipe.model.averaging import finalize  # torch: seconds, which --help does without

    num = checkpoint_count(args.exp_dir, args.num, overrides)
    if args.loss_margin < 0:
        raise BadInputError(f"--loss-margin must not be negative, got {args.loss_margin}")
    final = args.final_dir or args.exp_dir / "final"
    if args.done_fingerprint:
        (final / ".done").unlink(missing_ok=True)  # an earlier run's: final changes under it from here on
    outcome = finalize(args.exp_dir, num, final, margin=args.loss_margin, check=args.check_average,
                       device=args.device, threads=args.threads)
    if args.done_fingerprint:  # here, not by run.sh: the decode workers wait on it (a process start less)
        mark_done(final / ".done", args.done_fingerprint)
    log.info("%s written from %s", final, outcome.checkpoint)
    print(json.dumps({"final": str(final), "checkpoint": outcome.checkpoint, **outcome.info()}))


def build_parser() -> argparse.ArgumentParser:
    """This program's options (its --help; the docs' reference is made from it)."""
    parser = program_parser(__doc__)
    parser.add_argument("--exp-dir", type=Path, required=True)
    parser.add_argument("--num", type=int, help="checkpoints to average at most (default: the overrides' "
                        f"{NUM_KEY}, else <exp-dir>/config.yaml's, else 5)")
    parser.add_argument("--loss-margin", type=float, default=LOSS_MARGIN,
                        help="leave out a checkpoint whose recorded validation loss is more than this "
                        "fraction of the best's above the best's (default %(default)s: twice the best)")
    parser.add_argument("--check-average", type=str2bool, default=True,
                        help="compute the average's and the best checkpoint's validation loss; final is "
                        "the best checkpoint when the average's is higher (false: the average, unchecked)")
    parser.add_argument("--device", default="cpu", help="where the validation loss is computed (cpu, cuda)")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    parser.add_argument("--final-dir", type=Path, help="the averaged model dir (default: <exp-dir>/final)")
    parser.add_argument("--done-fingerprint", help="then write <final-dir>/.done with this fingerprint")
    parser.epilog = (parser.epilog or "") + ("\n\nAfter --: the run's Hydra overrides; stage 3 reads "
                                             f"{NUM_KEY} from them and ignores the rest (stage 2's).")
    return parser


def main(argv: list[str] | None = None) -> int:
    own, overrides = split_overrides(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(own)
    setup_logging()
    return run_main(lambda: run(args, overrides), log)


if __name__ == "__main__":
    install_lazy_funasr()  # before anything imports funasr: compat/lazy_import.py says why
    sys.exit(main())
