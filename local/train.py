"""Stage 2 entry point, one per rank under torchrun: funasr's own trainer with the recipe's additions
(funasr_recipe/model/trainer.py: classes registered, options as Hydra overrides; funasr_recipe/compat/:
the pinned surface checked, then the CPU patch, the fused losses and the hooks for metrics, memory plan
and OOM probe, activation checkpointing, the divergence guard (--max-bad-steps), freezing and LoRA,
atomic checkpoints, DeepSpeed's CPU Adam where the JSON offloads the optimizer, installed in order by
compat/install.py; funasr_recipe/train/: the list of utterances funasr would leave out, and the
warmup-cosine schedule).

Reads  the model config, dump/<set>/data.jsonl (or dump/<set>/raw.jsonl with --feats-type raw),
       dump/<train>/am.lfr<m>x<n>.mvn and dump/tokenizer/<tag>/ for a from-scratch model;
writes <exp-dir>/: funasr's checkpoints, config.yaml, TensorBoard log, train_skipped.tsv; Hydra's own
       files in <exp-dir>/.hydra.

  torchrun --nproc-per-node 2 -m local.train --config conf/tiny_sensevoice.yaml --exp-dir exp/x \\
      --train-set train --valid-set dev -- ++train_conf.max_epoch=3
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from funasr_recipe.core.cli import program_parser, run_main, split_overrides, str2bool
from funasr_recipe.core.lifetime import die_with_parent
from funasr_recipe.core.log import setup_logging
from funasr_recipe.model.defaults import DEFAULT_TARGETS

log = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    """This program's options (its --help; the docs' reference is made from it)."""
    parser = program_parser(__doc__)
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--exp-dir", type=Path, required=True)
    parser.add_argument("--data-dir", type=Path, default=Path("data"))
    parser.add_argument("--dump-dir", type=Path, default=Path("dump"))
    parser.add_argument("--train-set", required=True)
    parser.add_argument("--valid-set", required=True)
    parser.add_argument("--feats-type", choices=("fbank", "raw"), default="fbank")
    parser.add_argument("--train-engine", choices=("deepspeed", "ddp"), default="deepspeed")
    parser.add_argument("--ds-config", type=Path, default=Path("ds_configs/ds_stage1_bf16.json"))
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--pretrained-dir", type=Path, help="local dir of the config's pretrained_model")
    parser.add_argument("--strict", type=str2bool, default=False,
                        help="an utterance left out of training (exp-dir/train_skipped.tsv) is fatal")
    parser.add_argument("--metrics-port", type=int, default=0,
                        help="Prometheus endpoint on local rank 0 of each node (0: off)")
    parser.add_argument("--grad-checkpoint", type=str2bool, default=False,
                        help="recompute the encoder blocks' activations in backward (less memory)")
    parser.add_argument("--oom-probe", type=str2bool, default=True,
                        help="run the largest batches of epoch 0 once before training")
    parser.add_argument("--memory-limit-gib", type=float, default=None,
                        help="memory per process the probe allows (default: the GPU's; on CPU the host's "
                             "divided by its processes)")
    parser.add_argument("--max-bad-steps", type=int, default=10,
                        help="bad steps in a row (a non-finite or exploding loss, a non-finite gradient; "
                             "each is skipped) that stop training with advice (0: never stop)")
    parser.add_argument("--freeze", default="",
                        help="comma-separated module prefixes that do not train (funasr's freeze_param), "
                             "e.g. encoder")
    parser.add_argument("--adapter", choices=("none", "lora"), default="none",
                        help="lora: train LoRA adapters only; stages 3/4 merge them into the weights")
    parser.add_argument("--lora-rank", type=int, default=8)
    parser.add_argument("--lora-targets", default=",".join(DEFAULT_TARGETS),
                        help="comma-separated Linear module-name suffixes or regexes")
    parser.add_argument("--replay-sets", default="",
                        help="space-separated replay sets of --dump-dir (<dump-dir>/<set>/data.jsonl), mixed "
                             "into every epoch")
    parser.add_argument("--replay-ratio", type=float, default=1.0,
                        help="replay utterances per new one in each epoch, drawn anew from (seed, epoch)")
    parser.add_argument("--fused-losses", type=str2bool, default=True,
                        help="funasr's CTC/label-smoothing losses in fewer passes (compat/fused_losses.py); "
                             "false: funasr's own code (bench/bench_train.py compares them)")
    parser.add_argument("--dry-run", type=str2bool, default=False,
                        help="print the Hydra command line and exit")
    return parser


def main(argv: list[str] | None = None) -> int:
    own, overrides = split_overrides(sys.argv[1:] if argv is None else argv)
    args = vars(build_parser().parse_args(own))
    # First after the options (--help changes nothing): torchrun runs each rank in a session of its own,
    # so if torchrun is killed (kill -9, OOM killer) nothing else stops this rank from training on unseen
    # (funasr_recipe/core/lifetime.py).
    die_with_parent()
    # torch, DeepSpeed's and funasr's surface: seconds, which --help does without.
    from funasr_recipe.compat import finetune
    from funasr_recipe.compat.hooks import HookOptions
    from funasr_recipe.compat.install import install, run_trainer
    from funasr_recipe.data import replay
    from funasr_recipe.model.trainer import TrainSetup, hydra_argv, refuse_ranges, replay_train_list
    from funasr_recipe.train import skipped

    dry_run = args.pop("dry_run")
    fused = args.pop("fused_losses")
    hooks = HookOptions(metrics_port=args.pop("metrics_port"), grad_checkpoint=args.pop("grad_checkpoint"),
                        oom_probe=args.pop("oom_probe"), memory_limit_gib=args.pop("memory_limit_gib"),
                        max_bad_steps=args.pop("max_bad_steps"),
                        nproc_per_node=int(os.environ.get("LOCAL_WORLD_SIZE", 1)),
                        nnodes=max(1, int(os.environ.get("WORLD_SIZE", 1))
                                   // int(os.environ.get("LOCAL_WORLD_SIZE", 1))))
    tuning = finetune.FinetuneOptions.from_cli(args["exp_dir"], args.pop("freeze"), args.pop("adapter"),
                                               args.pop("lora_rank"), args.pop("lora_targets"))
    if tuning.freeze:
        overrides = [*overrides, f"++freeze_param='{','.join(tuning.freeze)}'"]
    replay_sets = args.pop("replay_sets").split()
    args["replay_lists"] = tuple(args["dump_dir"] / name / "data.jsonl" for name in replay_sets)
    setup = TrainSetup(**args)
    hydra_args = hydra_argv(setup, overrides)
    if dry_run:
        print("\n".join(hydra_args))
        return 0
    setup_logging()  # node and rank on the lines logged before Hydra configures logging
    # Everything patched into funasr, in its one order, after the installed packages are checked against
    # the pinned surface (compat/install.py): a changed funasr is exit 1 with every difference, not a hook
    # that silently never runs. Before the skipped-utterance check, which builds the config's tokenizer.
    if (rc := run_main(lambda: install(hooks, tuning, fused), log)) != 0:
        return rc
    # Before training: every utterance funasr's filters would drop, listed in <exp-dir>/train_skipped.tsv.
    # (run_main: --strict's BadInputError is exit 2 with one line, not a traceback on every rank.)
    def check_skipped() -> None:
        if setup.feats_type == "raw":
            for name in (setup.train_set, setup.valid_set):
                refuse_ranges(setup.dump_dir / name / "raw.jsonl")
        if setup.replay_lists:  # every rank writes the same bytes, atomically (and logs the counts)
            replay.write_train_list(setup.dump_dir / setup.train_set / "data.jsonl", setup.replay_lists,
                                    replay_train_list(setup), setup.data_dir)
        skipped.check(hydra_args, strict=setup.strict)

    if (rc := run_main(check_skipped, log)) != 0:
        return rc
    run_trainer(hydra_args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
