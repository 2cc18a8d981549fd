"""Stage 2 entry point, one per rank under torchrun: funasr's own trainer with the recipe's additions.

Registers the recipe's classes with funasr (feature datasets, Conformer-CTC, batch sampler), applies
the CPU patch (local/funasr_cpu_patch.py; a no-op with CUDA), turns the recipe's options into Hydra
overrides and hands over to ``funasr.bin.train_ds.main_hydra``: the trainer is not forked.

Reads  the model config, dump/<set>/data.jsonl (or data/<set>/data.jsonl with --feats-type raw),
       dump/<train>/am.lfr<m>x<n>.mvn and dump/tokenizer/<tag>/ for a from-scratch model;
writes <exp-dir>/: funasr's checkpoints, config.yaml, TensorBoard log; Hydra's own files in
       <exp-dir>/.hydra.

  torchrun --nproc-per-node 2 -m local.train --config conf/tiny_sensevoice.yaml --exp-dir exp/x \
      --train-set train --valid-set dev -- ++train_conf.max_epoch=3
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

import torch

from local.bad_input import split_overrides, str2bool
from local.compute_fbank import cmvn_name
from local.model_config import fbank_conf, load_config, pretrained_model, tokenizer_spec

log = logging.getLogger(__name__)


def tokenizer_file(dump_dir: Path, tag: str, kind: str) -> Path:
    """Where stage 1 wrote a from-scratch config's tokenizer model."""
    from local.make_tokenizer import model_file_name

    return dump_dir / "tokenizer" / tag / model_file_name(kind)


def hydra_argv(args: argparse.Namespace, overrides: list[str]) -> list[str]:
    """The command line funasr's ``main_hydra`` gets: config, recipe settings, then the user's overrides."""
    from local.feats_dataset import FBANK_DATASETS

    cfg = load_config(args.config, overrides)
    tag = args.config.stem
    exp = args.exp_dir.resolve()
    node, rank = os.environ.get("NODE_RANK", "0"), os.environ.get("RANK", "0")
    fmt = f"%(asctime)s %(levelname)s [node{node} rank{rank}] [%(filename)s:%(lineno)d] %(message)s"
    argv = [f"--config-path={args.config.parent.resolve()}", f"--config-name={args.config.name}",
            f"hydra.run.dir={exp}", "hydra.output_subdir=.hydra",
            f"hydra.job_logging.formatters.simple.format='{fmt}'",
            f"++output_dir={exp}", f"++device={args.device}",
            f"++backend={'nccl' if args.device == 'cuda' else 'gloo'}",
            f"++train_conf.use_deepspeed={str(args.train_engine == 'deepspeed').lower()}",
            f"++train_conf.deepspeed_config={args.ds_config.resolve()}",
            # One JSONL per set: the hub's data_split_num (32 for SenseVoice) would repeat it 32 times.
            "++dataset_conf.data_split_num=1",
            # funasr's AutoModel, which builds the model inside train_ds, calls
            # torch.set_num_threads(ncpu) with ncpu 4 by default, overriding OMP_NUM_THREADS: two ranks
            # on two cores then ran eight OpenMP threads that spun in barriers (80% system time, 1.2x
            # scaling). Keep the launcher's per-rank thread count.
            f"++ncpu={torch.get_num_threads()}"]
    source = args.dump_dir if args.feats_type == "fbank" else args.data_dir
    argv += [f"++train_data_set_list={(source / args.train_set / 'data.jsonl').resolve()}",
             f"++valid_data_set_list={(source / args.valid_set / 'data.jsonl').resolve()}"]
    if args.feats_type == "fbank":
        dataset = cfg.get("dataset", "AudioDataset")
        if dataset not in FBANK_DATASETS:
            raise ValueError(f"dataset {dataset} has no stage-1 feature variant "
                             f"(have {sorted(FBANK_DATASETS)}); use --feats-type raw")
        argv.append(f"++dataset={FBANK_DATASETS[dataset]}")
    if pretrained_model(cfg) is not None:
        if args.pretrained_dir is None:
            raise ValueError(f"{args.config} fine-tunes {pretrained_model(cfg)}: give its local copy with "
                             "--pretrained-dir (run.sh resolves it with local/resolve_model.py)")
        # funasr reads a model dir given as `model` (no model_conf): its config, weights (init_param),
        # am.mvn and tokenizer; our config's settings are merged over the model's.
        argv.append(f"++model={args.pretrained_dir.resolve()}")
    else:
        cmvn = args.dump_dir / args.train_set / cmvn_name(fbank_conf(cfg))
        argv.append(f"++frontend_conf.cmvn_file={cmvn.resolve()}")
        spec = tokenizer_spec(cfg)
        if spec is not None:
            model = tokenizer_file(args.dump_dir, tag, spec["kind"]).resolve()
            argv.append(f"++tokenizer_conf.bpemodel={model}")
    return argv + overrides


def main(argv: list[str] | None = None) -> None:
    own, overrides = split_overrides(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
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
    parser.add_argument("--dry-run", type=str2bool, default=False,
                        help="print the Hydra command line and exit")
    args = parser.parse_args(own)

    import local.feats_dataset  # noqa: F401  (registers the Fbank* datasets with funasr)
    from local import funasr_cpu_patch

    for optional in ("local.models", "local.batch_sampler"):  # register the recipe's model and sampler
        try:
            __import__(optional)
        except ModuleNotFoundError as e:
            if e.name != optional:
                raise
    hydra_args = hydra_argv(args, overrides)
    if args.dry_run:
        print("\n".join(hydra_args))
        return
    funasr_cpu_patch.apply()
    from funasr.bin.train_ds import main_hydra

    sys.argv = [sys.argv[0], *hydra_args]
    main_hydra()


if __name__ == "__main__":
    main()
