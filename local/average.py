"""Stage 3: average the n best checkpoints of a training run by validation loss, in fp32.

Reads  <exp-dir>/model.pt (the validation loss of every kept checkpoint) and the n best checkpoints
       (funasr_recipe/model/averaging.py: fp32 master weights, not funasr's bf16 copies);
writes <exp-dir>/model.pt.avg<n> and <final-dir> (default <exp-dir>/final): the average as a model dir
       in the hub's format, which decoding and export read (and <final-dir>/.done with --done-fingerprint).
Every checkpoint is loaded weights-only, DeepSpeed's shards included: one that holds anything but tensors,
containers and DeepSpeed's few data classes is refused (exit 2) before it can run code
(funasr_recipe/model/checkpoint.py says where a library loads otherwise).

  python -m local.average --exp-dir exp/tiny_sensevoice --num 5
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from omegaconf import OmegaConf

from funasr_recipe.core.cli import program_parser, run_main
from funasr_recipe.core.log import setup_logging
from funasr_recipe.core.rejections import BadInputError
from funasr_recipe.dist.markers import mark_done
from funasr_recipe.model.averaging import average
from funasr_recipe.model.model_dir import make_model_dir

log = logging.getLogger(__name__)


def run(args: argparse.Namespace) -> None:
    num = args.num
    if num is None:
        config = args.exp_dir / "config.yaml"
        if not config.is_file():
            raise FileNotFoundError(f"{config}: no resolved config; has stage 2 run in {args.exp_dir}?")
        num = int(OmegaConf.load(config).get("train_conf", {}).get("avg_nbest_model", 5))
    if num < 1:
        raise BadInputError(f"--num must be positive, got {num}")
    out, names, losses = average(args.exp_dir, num)
    final = args.final_dir or args.exp_dir / "final"
    make_model_dir(args.exp_dir, out.name, final, info={"averaged": {name: losses[name] for name in names}})
    if args.done_fingerprint:  # here, not by run.sh: the decode workers wait on it (a process start less)
        mark_done(final / ".done", args.done_fingerprint)
    log.info("%s and %s written", out, final)
    print(json.dumps({"averaged": str(out)}))


def main(argv: list[str] | None = None) -> int:
    parser = program_parser(__doc__)
    parser.add_argument("--exp-dir", type=Path, required=True)
    parser.add_argument("--num", type=int, help="checkpoints to average (default: the config's "
                        "train_conf.avg_nbest_model in <exp-dir>/config.yaml, else 5)")
    parser.add_argument("--final-dir", type=Path, help="default: <exp-dir>/final")
    parser.add_argument("--done-fingerprint", help="then write <final-dir>/.done with this fingerprint")
    args = parser.parse_args(argv)
    setup_logging()
    return run_main(lambda: run(args), log)


if __name__ == "__main__":
    sys.exit(main())
