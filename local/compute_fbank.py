"""Stage 1: fbank features of every set, computed once by every process of every node; node 0 merges.

Reads  <data-dir>/<set>/data.jsonl (stage 0) and the model config's ``frontend_conf`` (+ overrides);
``work`` (each rank) writes <dump-dir>/<set>/shards/ for its shards (funasr_recipe/features/dump.py);
``merge`` (node 0) waits for all shards, writes <dump-dir>/<set>/{data.jsonl,feats.scp,rejected.tsv,
report.json}, <dump-dir>/<train-set>/am.mvn and, for a from-scratch model, the tokenizer in
--tokenizer-dir; then it takes out of each set the utterances whose target is too long for CTC to
align to their audio (funasr_recipe/features/targets.py), with that tokenizer or, fine-tuning, the one
in --pretrained-dir.

  python -m local.compute_fbank work --rank 0 --world-size 2 --config conf/tiny_sensevoice.yaml \\
      --sets "dev train" --train-set train
  python -m local.compute_fbank merge --world-size 2 --config conf/tiny_sensevoice.yaml \\
      --sets "dev train" --train-set train --tokenizer-dir dump/tokenizer/tiny_sensevoice
  python -m local.compute_fbank merge --config conf/sensevoice_small.yaml --sets "dev train" \\
      --train-set train --pretrained-dir /models/SenseVoiceSmall
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from omegaconf import DictConfig

from funasr_recipe.compat.lazy_import import install as install_lazy_funasr
from funasr_recipe.compat.lazy_import import register_config
from funasr_recipe.core.cli import env_rank, program_parser, run_main, split_overrides, str2bool
from funasr_recipe.core.log import setup_logging
from funasr_recipe.features.dump import SetPlan, compute_shards, merge_set, plan_sets, write_cmvn
from funasr_recipe.features.fbank import FbankConf
from funasr_recipe.features.targets import ctc_frames, load_tokenizer, reject_impossible_targets
from funasr_recipe.model import config
from funasr_recipe.model.pretrained import resolve

log = logging.getLogger(__name__)


def run(args: argparse.Namespace) -> None:
    cfg = config.load_config(args.config, args.overrides)
    conf = config.fbank_conf(cfg)
    plans = plan_sets(args.data_dir, args.dump_dir, args.sets.split(), args.train_set, args.speed_perturb,
                      args.shard_size, conf, args.world_size)
    if args.mode == "work":
        compute_shards(plans, conf, args.rank, args.world_size, args.strict)
        return
    for plan in plans:
        _, stats = merge_set(plan, conf, args.world_size, args.wait_timeout)
        if plan.name == args.train_set:
            write_cmvn(plan, stats, conf)
            if config.pretrained_model(cfg):
                log.info("fine-tuning %s: training keeps the pretrained model's own am.mvn; %s is written "
                         "for reference only", config.pretrained_model(cfg), plan.out / "am.mvn")
    spec = config.tokenizer_spec(cfg)
    built = None
    if spec is None:
        log.info("no tokenizer to build: %s", f"{config.pretrained_model(cfg)} brings its own"
                 if config.pretrained_model(cfg) else f"{args.config} has no build_tokenizer section")
    else:
        from funasr_recipe.model.tokenizer import build_tokenizer  # sentencepiece is only needed here

        built = build_tokenizer(args.data_dir / args.train_set / "data.jsonl", args.tokenizer_dir, **spec,
                                tokenizer=cfg.get("tokenizer"))
        log.info("tokenizer for %s: %s", args.config, built)
    check_targets(args, cfg, conf, plans, built)


def check_targets(args: argparse.Namespace, cfg: DictConfig, conf: FbankConf, plans: list[SetPlan],
                  built: Path | None) -> None:
    """Reject the merged utterances whose target CTC cannot align to their audio, with the tokenizer
    training will use: the one just built, or the pretrained model's."""
    if name := config.pretrained_model(cfg):
        model_dir = args.pretrained_dir or (Path(name) if Path(name).is_dir() else None)
        if model_dir is None:
            log.warning("target-length check skipped: %s fine-tunes %s, whose tokenizer is not at hand; "
                        "give its local copy with --pretrained-dir", args.config, name)
            return
        model_cfg = config.funasr_config(cfg, resolve(name, model_dir))
    elif built is not None:  # what stage 2 gives funasr: our config, with the tokenizer just built
        model_cfg = config.funasr_config(cfg)
        model_cfg["tokenizer_conf"] = {**(model_cfg.get("tokenizer_conf") or {}), "bpemodel": str(built)}
    else:
        log.warning("target-length check skipped: %s neither builds a tokenizer (build_tokenizer) nor "
                    "fine-tunes a pretrained model that brings one", args.config)
        return
    # The recipe's classes, then funasr's that the config names: ctc_frames reads their defaults.
    import funasr_recipe.model.conformer_ctc  # noqa: F401  (registers ConformerCTC)
    import funasr_recipe.model.sensevoice_tokenizer  # noqa: F401  (a from-scratch SenseVoice's tokenizer class)

    register_config(model_cfg)
    ctc = ctc_frames(model_cfg, FbankConf.from_frontend_conf(model_cfg.get("frontend_conf") or {}).lfr_n)
    if ctc is None:
        log.info("target-length check skipped: %s computes no CTC loss", model_cfg.get("model"))
        return
    try:
        tokenizer = load_tokenizer(model_cfg)
    except Exception as e:  # the config's own problem, which stage 2 reports; the check only needs it
        log.warning("target-length check skipped: funasr cannot build the tokenizer %s(%s): %s: %s",
                    model_cfg.get("tokenizer"), model_cfg.get("tokenizer_conf"), type(e).__name__, e)
        return
    for plan in plans:
        reject_impossible_targets(plan, ctc, tokenizer.encode, conf.frame_shift, args.strict)


def main(argv: list[str] | None = None) -> int:
    parser = program_parser(__doc__)
    parser.add_argument("mode", choices=("work", "merge"))
    parser.add_argument("--config", type=Path, required=True, help="model config (conf/*.yaml)")
    parser.add_argument("--data-dir", type=Path, default=Path("data"))
    parser.add_argument("--dump-dir", type=Path, default=Path("dump"))
    parser.add_argument("--sets", required=True, help="space-separated set names")
    parser.add_argument("--train-set", required=True, help="the set that is speed-perturbed and gives CMVN")
    parser.add_argument("--speed-perturb", default="1.0",
                        help="factors for the training set, e.g. '0.9 1.0 1.1'")
    parser.add_argument("--shard-size", type=int, default=1000,
                        help="jobs per shard at most (unit of resumption); a set too small to give each "
                             "process a shard of that size is cut into one shard per process")
    parser.add_argument("--rank", type=int, default=env_rank(),
                        help="global rank of this process (work; default: $RANK)")
    parser.add_argument("--world-size", type=int, default=1,
                        help="processes over all nodes (work and merge alike: it sets a small set's shards)")
    parser.add_argument("--strict", type=str2bool, default=False, help="stop at the first bad utterance")
    parser.add_argument("--wait-timeout", type=float, default=7200, help="merge: seconds to wait for shards")
    parser.add_argument("--tokenizer-dir", type=Path, default=Path("dump/tokenizer"))
    parser.add_argument("--pretrained-dir", type=Path,
                        help="merge: local dir of the config's pretrained_model, whose tokenizer the "
                             "target-length check uses")
    own, overrides = split_overrides(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(own)
    args.overrides = overrides  # Hydra overrides of the config, as run.sh passes them after --
    setup_logging()
    return run_main(lambda: run(args), log)


if __name__ == "__main__":
    install_lazy_funasr()  # before anything imports funasr: compat/lazy_import.py says why
    sys.exit(main())
