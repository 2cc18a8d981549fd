"""Stage 1: fbank features of every set, computed once by every process of every node; node 0 merges.

Reads  <data-dir>/<set>/data.jsonl (stage 0) and the model config's ``frontend_conf``, ``feats_storage``
(+ overrides; float32, or uint16 for half the bytes: funasr_recipe/features/storage.py) and
``feats_augment`` (the training set's rooms, noise and gain: funasr_recipe/features/augment.py);
``work`` (each rank) writes <dump-dir>/<set>/shards/ for its shards (funasr_recipe/features/dump.py);
``merge`` (node 0) waits for all shards, writes <dump-dir>/<set>/{data.jsonl,feats.scp,rejected.tsv,
report.json}, <dump-dir>/<train-set>/am.mvn and, for a from-scratch model, the tokenizer in --tokenizer-dir;
then it takes out of each set the utterances whose target is too long for CTC to align to their audio
(funasr_recipe/features/targets.py), with that tokenizer or, fine-tuning, the one in --pretrained-dir; last,
each set's raw.jsonl and the line indexes <dump-dir>/<set>/{data,raw}.jsonl.idx that stage 2 maps
(funasr_recipe/data/line_index.py). ``verify`` (before stage 1 trusts a finished dump, and before stage 2
reads it) checks every shard the sets' <dump-dir>/<set>/data.jsonl name against the size and crc32 stage 1
recorded in its marker (funasr_recipe/features/shard_sums.py): one line per shard that fails, naming the
file and what was expected and found, then exit 1; with --repair true it also removes those shards' markers,
their sets' merged lists and <dump-dir>/.done, so that the next stage-1 run recomputes exactly those shards.
A shard made before checksums were recorded cannot be checked and counts as failing.

  .venv/bin/python -m local.compute_fbank work --rank 0 --world-size 2 --config conf/tiny_sensevoice.yaml \\
      --sets "dev train" --train-set train
  .venv/bin/python -m local.compute_fbank merge --world-size 2 --config conf/tiny_sensevoice.yaml \\
      --sets "dev train" --train-set train --tokenizer-dir dump/tokenizer/tiny_sensevoice
  .venv/bin/python -m local.compute_fbank merge --config conf/sensevoice_small.yaml --sets "dev train" \\
      --train-set train --pretrained-dir /models/SenseVoiceSmall
  .venv/bin/python -m local.compute_fbank verify --dump-dir dump --sets "train dev" [--repair true]
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from omegaconf import DictConfig

from funasr_recipe.compat.lazy_import import install as install_lazy_funasr
from funasr_recipe.compat.lazy_import import register_config
from funasr_recipe.core.cli import StageFailed, env_rank, program_parser, run_main, split_overrides, str2bool
from funasr_recipe.core.log import setup_logging
from funasr_recipe.data import textnorm
from funasr_recipe.data.line_index import build_index
from funasr_recipe.features.dump import SetPlan, compute_shards, merge_set, plan_sets, write_cmvn
from funasr_recipe.features.fbank_conf import FbankConf
from funasr_recipe.features.shard_sums import ADVICE, verify_sets
from funasr_recipe.features.targets import (
    ctc_frames,
    load_tokenizer,
    normalise_targets,
    reject_impossible_targets,
    vocab_pieces,
    write_raw_list,
)
from funasr_recipe.model import config
from funasr_recipe.model.pretrained import resolve
from funasr_recipe.model.provenance import describe_model_dir

log = logging.getLogger(__name__)


def verify(args: argparse.Namespace) -> None:
    """The ``verify`` mode: StageFailed (exit 1) when a shard fails its check."""
    bad = verify_sets(args.dump_dir, args.sets.split(), args.repair, args.threads)
    if bad:
        unverifiable = sum(c.unverifiable for c in bad)
        found = []
        if mismatched := len(bad) - unverifiable:
            found.append(f"{mismatched} shard(s) do not match the checksum stage 1 recorded")
        if unverifiable:
            found.append(f"{unverifiable} shard(s) cannot be checked")
        raise StageFailed(f"{args.dump_dir}: {' and '.join(found)} (listed above); "
                          + (f"they are repaired: {ADVICE}" if args.repair else
                             f"{ADVICE} (run.sh's stage 1 repairs them first; by hand: --repair true)"))
    log.info("%s: every shard of set(s) %s matches its record", args.dump_dir, " ".join(args.sets.split()))


def run(args: argparse.Namespace) -> None:
    if args.mode == "verify":
        verify(args)
        return
    cfg = config.load_config(args.config, args.overrides)
    conf = config.fbank_conf(cfg)
    plans = plan_sets(args.data_dir, args.dump_dir, args.sets.split(), args.train_set, args.speed_perturb,
                      args.shard_size, conf, args.world_size, config.feats_storage(cfg),
                      config.feats_augment(cfg))
    if args.mode == "work":
        compute_shards(plans, conf, args.rank, args.world_size, args.strict)
        return
    for plan in plans:
        _, stats = merge_set(plan, conf, args.world_size, args.wait_timeout)
        if plan.name == args.train_set:
            write_cmvn(plan, stats, conf)
            if config.pretrained_model(cfg):
                log.info("fine-tuning %s: training keeps the pretrained model's own am.mvn; %s is written "
                         "for reference only", _pretrained(args, cfg), plan.out / "am.mvn")
    spec = config.tokenizer_spec(cfg)
    built = None
    if spec is None:
        log.info("no tokenizer to build: %s", f"{_pretrained(args, cfg)} brings its own"
                 if config.pretrained_model(cfg) else f"{args.config} has no build_tokenizer section")
    else:
        from funasr_recipe.model.tokenizer import build_tokenizer  # sentencepiece is only needed here

        built = build_tokenizer(args.data_dir / args.train_set / "data.jsonl", args.tokenizer_dir, **spec,
                                tokenizer=cfg.get("tokenizer"), text_norm=textnorm.from_config(cfg))
        log.info("tokenizer for %s: %s", args.config, built)
    check_targets(args, cfg, conf, plans, built)


def check_targets(args: argparse.Namespace, cfg: DictConfig, conf: FbankConf, plans: list[SetPlan],
                  built: Path | None) -> None:
    """Normalise every merged target (data/textnorm.py: the config's ``transcript_norm``), then, with the
    tokenizer training will use (the one just built, or the pretrained model's), list the targets it
    cannot represent (untokenizable.tsv) and reject the utterances whose target CTC cannot align to their
    audio; last, each set's raw.jsonl for training on the audio (the same utterances and targets), and
    the line index of both lists."""
    _check_targets(args, cfg, conf, plans, built)
    for plan in plans:
        write_raw_list(plan)
        # Last, once the lists are final: stage 2's IndexDSJsonlMmap then maps these instead of parsing
        # every line in every rank.
        for listing in ("data.jsonl", "raw.jsonl"):
            build_index(plan.out / listing)


def _check_targets(args: argparse.Namespace, cfg: DictConfig, conf: FbankConf, plans: list[SetPlan],
                   built: Path | None) -> None:
    model_cfg = _tokenizer_config(args, cfg, built)
    tokenizer = None
    if model_cfg is not None:
        try:
            tokenizer = load_tokenizer(model_cfg)
        except Exception as e:  # the config's own problem, which stage 2 reports; the check only needs it
            log.warning("target-length check skipped: funasr cannot build the tokenizer %s(%s): %s: %s",
                        model_cfg.get("tokenizer"), model_cfg.get("tokenizer_conf"), type(e).__name__, e)
    norm = textnorm.from_config(cfg)
    if norm.needs_vocab and tokenizer is None:
        log.warning("transcript_norm: case 'vocab' taken as 'keep': the pretrained tokenizer is not at hand")
    norm = norm.resolved(None if tokenizer is None else vocab_pieces(tokenizer))
    for plan in plans:
        normalise_targets(plan, tokenizer, norm)
    if tokenizer is None:
        return
    ctc = ctc_frames(model_cfg, FbankConf.from_frontend_conf(model_cfg.get("frontend_conf") or {}).lfr_n)
    if ctc is None:
        log.info("target-length check skipped: %s computes no CTC loss", model_cfg.get("model"))
        return
    for plan in plans:
        reject_impossible_targets(plan, ctc, tokenizer.encode, conf.frame_shift, args.strict)


def _pretrained(args: argparse.Namespace, cfg: DictConfig) -> str:
    """The model a fine-tune starts from, as the logs name it: the --pretrained-dir it uses (and the hub id
    it is a copy of), not the config's ``pretrained_model`` where a local dir stands in for it."""
    if args.pretrained_dir is not None:
        return describe_model_dir(args.pretrained_dir)
    return str(config.pretrained_model(cfg))


def _tokenizer_config(args: argparse.Namespace, cfg: DictConfig, built: Path | None) -> dict | None:
    """The config funasr builds training's tokenizer from (classes registered), or None (logged) where the
    tokenizer is not at hand."""
    if name := config.pretrained_model(cfg):
        model_dir = args.pretrained_dir or (Path(name) if Path(name).is_dir() else None)
        if model_dir is None:
            log.warning("target-length check skipped: %s fine-tunes %s, whose tokenizer is not at hand; "
                        "give its local copy with --pretrained-dir", args.config, name)
            return None
        model_cfg = config.funasr_config(cfg, resolve(name, model_dir))
    elif built is not None:  # what stage 2 gives funasr: our config, with the tokenizer just built
        model_cfg = config.funasr_config(cfg)
        model_cfg["tokenizer_conf"] = {**(model_cfg.get("tokenizer_conf") or {}), "bpemodel": str(built)}
    else:
        log.warning("target-length check skipped: %s neither builds a tokenizer (build_tokenizer) nor "
                    "fine-tunes a pretrained model that brings one", args.config)
        return None
    # The recipe's classes, then funasr's that the config names: ctc_frames reads their defaults.
    import funasr_recipe.model.conformer_ctc  # noqa: F401  (registers ConformerCTC)
    import funasr_recipe.model.sensevoice_tokenizer  # noqa: F401  (a from-scratch SenseVoice's tokenizer class)

    register_config(model_cfg)
    return model_cfg


def build_parser() -> argparse.ArgumentParser:
    """This program's options (its --help; the docs' reference is made from it)."""
    parser = program_parser(__doc__)
    parser.add_argument("mode", choices=("work", "merge", "verify"))
    parser.add_argument("--config", type=Path, help="model config (conf/*.yaml); work and merge")
    parser.add_argument("--data-dir", type=Path, default=Path("data"))
    parser.add_argument("--dump-dir", type=Path, default=Path("dump"))
    parser.add_argument("--sets", required=True, help="space-separated set names")
    parser.add_argument("--train-set", help="work and merge: the set that is speed-perturbed and gives CMVN")
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
    parser.add_argument("--repair", type=str2bool, default=False,
                        help="verify: remove the failing shards' markers, their sets' merged lists and "
                             "<dump-dir>/.done, so that stage 1 recomputes them")
    parser.add_argument("--threads", type=int, default=8, help="verify: shards checked at once")
    return parser


def main(argv: list[str] | None = None) -> int:
    own, overrides = split_overrides(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(own)
    if args.mode != "verify" and (args.config is None or args.train_set is None):
        parser.error(f"{args.mode} needs --config and --train-set")
    args.overrides = overrides  # Hydra overrides of the config, as run.sh passes them after --
    setup_logging()
    return run_main(lambda: run(args), log)


if __name__ == "__main__":
    install_lazy_funasr()  # before anything imports funasr: compat/lazy_import.py says why
    sys.exit(main())
