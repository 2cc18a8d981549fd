"""Stage 2 (and 3): the local directory of the pretrained model a config fine-tunes.

Reads  the config's ``pretrained_model`` (hub name or directory, + overrides) and ``--pretrained-dir``;
writes the resolved directory to stdout (nothing for a from-scratch config, where --pretrained-dir is an
error); funasr_recipe/model/pretrained.py finds it (a local dir, the ModelScope cache, or a download;
offline, the command to run) and checks that it holds the config's model class.
With --training-data: the training set that --pretrained-dir's model says it was trained on (a model dir
of this recipe, when the set is still there; nothing for a from-scratch config): run.sh's default replay.
With --describe DIR: what the model dir DIR is, for run.sh's log (model/provenance.py): the dir and the
hub id it is a local copy of, or the run of this recipe that made it.

  .venv/bin/python -m local.resolve_model --config conf/sensevoice_small.yaml [--pretrained-dir DIR]
  .venv/bin/python -m local.resolve_model --config conf/sensevoice_small.yaml --pretrained-dir DIR \\
      --training-data
  .venv/bin/python -m local.resolve_model --describe /models/SenseVoiceSmall
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from funasr_recipe.core.cli import program_parser, run_main, split_overrides
from funasr_recipe.core.log import setup_logging
from funasr_recipe.core.rejections import BadInputError
from funasr_recipe.model.config import load_config, pretrained_model
from funasr_recipe.model.model_dir import recorded_training_data
from funasr_recipe.model.pretrained import check_fits, resolve
from funasr_recipe.model.provenance import describe_model_dir

log = logging.getLogger(__name__)


def run(args: argparse.Namespace, overrides: list[str]) -> None:
    cfg = load_config(args.config, overrides)
    name = pretrained_model(cfg)
    if args.training_data:
        if args.pretrained_dir is None:
            raise BadInputError("--training-data asks what --pretrained-dir's model was trained on: give it")
        data = recorded_training_data(args.pretrained_dir) if name is not None else None
        if data is not None:
            print(data)
        return
    model_dir = None if name is None else resolve(name, args.pretrained_dir)
    check_fits(args.config, name, cfg.get("model"), args.pretrained_dir, model_dir)
    if model_dir is not None:
        print(model_dir)


def build_parser() -> argparse.ArgumentParser:
    """This program's options (its --help; the docs' reference is made from it)."""
    parser = program_parser(__doc__)
    parser.add_argument("--config", type=Path,
                        help="the model config (conf/*.yaml); required, but for --describe")
    parser.add_argument("--pretrained-dir", type=Path, help="a local copy of the config's pretrained model")
    parser.add_argument("--training-data", action="store_true",
                        help="print the training set --pretrained-dir's model records (a model dir of this "
                        "recipe), if it is still there, instead of the model's dir")
    parser.add_argument("--describe", type=Path, metavar="DIR",
                        help="print what the model dir DIR is (a hub id's local copy, a run of this recipe)")
    return parser


def main(argv: list[str] | None = None) -> int:
    own, overrides = split_overrides(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(own)
    setup_logging()
    if args.describe is not None:
        return run_main(lambda: print(describe_model_dir(args.describe)), log)
    if args.config is None:
        parser.error("the following arguments are required: --config")
    return run_main(lambda: run(args, overrides), log)


if __name__ == "__main__":
    sys.exit(main())
