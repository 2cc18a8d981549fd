"""Stage 1: fbank features of every set, computed once by every process of every node; node 0 merges.

Reads  <data-dir>/<set>/data.jsonl (stage 0) and the model config's ``frontend_conf`` (+ overrides);
``work`` (each rank) writes <dump-dir>/<set>/shards/ for its shards (funasr_recipe/features/dump.py);
``merge`` (node 0) waits for all shards, writes <dump-dir>/<set>/{data.jsonl,feats.scp,rejected.tsv,
report.json}, <dump-dir>/<train-set>/am.mvn and, for a from-scratch model, the tokenizer in
--tokenizer-dir.

  python -m local.compute_fbank work --rank 0 --world-size 2 --config conf/tiny_sensevoice.yaml \\
      --sets "dev train" --train-set train
  python -m local.compute_fbank merge --world-size 2 --config conf/tiny_sensevoice.yaml \\
      --sets "dev train" --train-set train --tokenizer-dir dump/tokenizer/tiny_sensevoice
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from funasr_recipe.core.cli import env_rank, run_main, split_overrides, str2bool
from funasr_recipe.core.log import setup_logging
from funasr_recipe.features.dump import compute_shards, merge_set, plan_sets, write_cmvn
from funasr_recipe.model.config import fbank_conf, load_config, pretrained_model, tokenizer_spec

log = logging.getLogger(__name__)


def run(args: argparse.Namespace) -> None:
    cfg = load_config(args.config, args.overrides)
    conf = fbank_conf(cfg)
    plans = plan_sets(args.data_dir, args.dump_dir, args.sets.split(), args.train_set, args.speed_perturb,
                      args.shard_size, conf)
    if args.mode == "work":
        compute_shards(plans, conf, args.rank, args.world_size, args.strict)
        return
    for plan in plans:
        _, stats = merge_set(plan, conf, args.world_size, args.wait_timeout)
        if plan.name == args.train_set:
            write_cmvn(plan, stats, conf)
            if pretrained_model(cfg):
                log.info("fine-tuning %s: training keeps the pretrained model's own am.mvn; %s is written "
                         "for reference only", pretrained_model(cfg), plan.out / "am.mvn")
    spec = tokenizer_spec(cfg)
    if spec is None:
        log.info("no tokenizer to build: %s", f"{pretrained_model(cfg)} brings its own"
                 if pretrained_model(cfg) else f"{args.config} has no build_tokenizer section")
        return
    from funasr_recipe.model.tokenizer import build_tokenizer  # sentencepiece is only needed here

    model = build_tokenizer(args.data_dir / args.train_set / "data.jsonl", args.tokenizer_dir, **spec)
    log.info("tokenizer for %s: %s", args.config, model)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=("work", "merge"))
    parser.add_argument("--config", type=Path, required=True, help="model config (conf/*.yaml)")
    parser.add_argument("--data-dir", type=Path, default=Path("data"))
    parser.add_argument("--dump-dir", type=Path, default=Path("dump"))
    parser.add_argument("--sets", required=True, help="space-separated set names")
    parser.add_argument("--train-set", required=True, help="the set that is speed-perturbed and gives CMVN")
    parser.add_argument("--speed-perturb", default="1.0",
                        help="factors for the training set, e.g. '0.9 1.0 1.1'")
    parser.add_argument("--shard-size", type=int, default=1000, help="jobs per shard (unit of resumption)")
    parser.add_argument("--rank", type=int, default=env_rank(),
                        help="global rank of this process (work; default: $RANK)")
    parser.add_argument("--world-size", type=int, default=1, help="processes over all nodes")
    parser.add_argument("--strict", type=str2bool, default=False, help="stop at the first bad utterance")
    parser.add_argument("--wait-timeout", type=float, default=7200, help="merge: seconds to wait for shards")
    parser.add_argument("--tokenizer-dir", type=Path, default=Path("dump/tokenizer"))
    own, overrides = split_overrides(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(own)
    args.overrides = overrides  # Hydra overrides of the config, as run.sh passes them after --
    setup_logging()
    return run_main(lambda: run(args), log)


if __name__ == "__main__":
    sys.exit(main())
