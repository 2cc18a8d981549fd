"""What stage 2 hands to funasr's own trainer: the recipe's classes registered and the recipe's options as
Hydra overrides of ``funasr.bin.train_ds.main_hydra`` (the trainer is not forked).

Reads  the model config, dump/<set>/data.jsonl (or dump/<set>/raw.jsonl with --feats-type raw),
       dump/<train>/am.lfr<m>x<n>.mvn and dump/tokenizer/<tag>/ for a from-scratch model (the paths it
       puts in the overrides), and for ``resolved_config`` a fine-tune's model dir config; writes nothing.

  hydra_args = hydra_argv(TrainSetup(config=Path("conf/tiny_sensevoice.yaml"), ...), overrides)
  register_recipe_classes()

What acts before and around the trainer (the skipped-utterance check of train/skipped.py; the patches of
funasr_recipe/compat/: the CPU patch, the hooks, the atomic checkpoints, and ``run_trainer`` itself in
compat/install.py) is called by local/train.py, the program: this layer may not import them
(tests/unit/repo/test_style.py).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from funasr_recipe.core.jsonl import iter_jsonl
from funasr_recipe.core.log import log_format
from funasr_recipe.core.rejections import BadInputError
from funasr_recipe.features.audio import split_range
from funasr_recipe.features.cmvn import cmvn_name
from funasr_recipe.model.config import fbank_conf, load_config, pretrained_model, tokenizer_spec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainSetup:
    """The recipe's options of one training run: local/train.py's command line, whose parser holds their
    defaults."""

    config: Path
    exp_dir: Path
    train_set: str
    valid_set: str
    data_dir: Path
    dump_dir: Path
    feats_type: str  # fbank: stage-1 features; raw: funasr's datasets on the audio
    train_engine: str  # deepspeed or ddp
    ds_config: Path
    device: str  # cpu or cuda
    pretrained_dir: Path | None
    strict: bool = False  # an utterance stage 2 would skip (train_skipped.tsv) is fatal
    replay_lists: tuple[Path, ...] = ()  # stage-1 data.jsonl of each replay set, mixed into every epoch
    replay_ratio: float = 1.0  # replay utterances per new one in each epoch


def replay_train_list(args: TrainSetup) -> Path:
    """Where a run with replay has its training list: the new set's lines, then every replay pool's
    (funasr_recipe/data/replay.py writes it; the sampler tells the two apart by their sources)."""
    return args.exp_dir / "train_replay.jsonl"


def tokenizer_file(dump_dir: Path, tag: str, kind: str) -> Path:
    """Where stage 1 wrote a from-scratch config's tokenizer model."""
    from funasr_recipe.model.tokenizer import model_file_name

    return dump_dir / "tokenizer" / tag / model_file_name(kind)


def refuse_ranges(raw_jsonl: Path) -> None:
    """BadInputError naming the first utterance of raw_jsonl that is a time range of a recording
    (segments, lhotse supervisions): funasr's own dataset, which --feats-type raw trains with, reads
    whole files and would train on the whole recording under the segment's transcript."""
    for lineno, obj in iter_jsonl(raw_jsonl):
        if split_range(str(obj.get("source", "")))[1] is not None:
            raise BadInputError(f"{raw_jsonl}:{lineno}: {obj.get('key')}: --feats-type raw trains through "
                                "funasr's own dataset, which reads whole files, and this utterance is a "
                                f"range of a recording ({obj['source']}); use --feats-type fbank")


def hydra_argv(args: TrainSetup, overrides: list[str]) -> list[str]:
    """The command line funasr's ``main_hydra`` gets: config, recipe settings, then the user's overrides."""
    from funasr_recipe.data.feats_dataset import FBANK_DATASETS

    cfg = load_config(args.config, overrides)
    tag = args.config.stem
    exp = args.exp_dir.resolve()
    argv = [f"--config-path={args.config.parent.resolve()}", f"--config-name={args.config.name}",
            f"hydra.run.dir={exp}", "hydra.output_subdir=.hydra",
            f"hydra.job_logging.formatters.simple.format='{log_format()}'",
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
            f"++ncpu={torch.get_num_threads()}",
            # funasr's train_ds builds its AutoModel without disable_update, which then asks PyPI for
            # funasr's latest version (requests.get, no timeout): offline that waits on the connect.
            "++disable_update=true"]
    # raw: stage 1's raw.jsonl, stage 0's audio entries with the targets normalised as for the features
    # (features/targets.py write_raw_list), not data/<set>/data.jsonl as the user wrote them.
    listing = "data.jsonl" if args.feats_type == "fbank" else "raw.jsonl"
    train_list = args.dump_dir / args.train_set / listing
    if args.replay_lists:
        if args.feats_type != "fbank":
            raise BadInputError("replay needs stage-1 features (--feats-type fbank): the replay sets are "
                                "featurised by stage 1 like the training set")
        sampler = OmegaConf.select(cfg, "dataset_conf.batch_sampler")
        if sampler != "LengthBucketBatchSampler":
            # funasr's own samplers would take the whole list every epoch, replay pools included.
            raise BadInputError(f"replay draws its utterances in the recipe's batch sampler; {args.config} "
                                f"uses {sampler}: add ++dataset_conf.batch_sampler=LengthBucketBatchSampler")
        train_list = replay_train_list(args)
        pools = ",".join(f"'{p.resolve()}'" for p in args.replay_lists)  # quoted: paths may hold spaces
        argv += [f"++dataset_conf.replay_list=[{pools}]", f"++dataset_conf.replay_ratio={args.replay_ratio}"]
    argv += [f"++train_data_set_list={train_list.resolve()}",
             f"++valid_data_set_list={(args.dump_dir / args.valid_set / listing).resolve()}"]
    if args.feats_type == "fbank":
        dataset = cfg.get("dataset", "AudioDataset")
        if dataset not in FBANK_DATASETS:
            raise BadInputError(f"dataset {dataset} has no stage-1 feature variant "
                                f"(have {sorted(FBANK_DATASETS)}); use --feats-type raw")
        argv.append(f"++dataset={FBANK_DATASETS[dataset]}")
    if pretrained_model(cfg) is not None:
        if args.pretrained_dir is None:
            raise BadInputError(f"{args.config} fine-tunes {pretrained_model(cfg)}: give its local copy with "
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


def resolved_config(hydra_args: list[str]) -> dict[str, Any]:
    """The config funasr's ``train_ds`` runs with for ``hydra_argv``'s command line: Hydra's composition of
    the config and its overrides and, for a model dir given as ``model`` (a fine-tune, no model_conf), that
    dir's config under it as funasr's ``download_model`` merges them (the run's keys win)."""
    from hydra import compose, initialize_config_dir

    options = dict(a.split("=", 1) for a in hydra_args if a.startswith("--config-"))
    # The hydra.* overrides configure Hydra's own run (its dir, its logging), not the job's config.
    overrides = [a for a in hydra_args if not a.startswith("--") and not a.lstrip("+~").startswith("hydra.")]
    with initialize_config_dir(config_dir=options["--config-path"], version_base=None):
        cfg = compose(config_name=options["--config-name"], overrides=overrides)
    model = cfg.get("model")
    if "model_conf" not in cfg and isinstance(model, str) and Path(model).is_dir():
        from funasr.download.download_model_from_hub import add_file_root_path

        model_dir = Path(model)
        rooted: dict = {"config": str(model_dir / "config.yaml")}
        if (model_dir / "configuration.json").is_file():
            conf = json.loads((model_dir / "configuration.json").read_text(encoding="utf-8"))
            add_file_root_path(str(model_dir), conf.get("file_path_metas") or {}, rooted)
        if Path(rooted["config"]).is_file():
            cfg = OmegaConf.merge(OmegaConf.load(rooted["config"]), rooted, cfg)
    return OmegaConf.to_container(cfg, resolve=True)


def register_recipe_classes() -> None:
    """Put the recipe's datasets, index, sampler, model and tokenizer classes in funasr's registry tables
    (importing them)."""
    import funasr_recipe.data.batch_sampler  # noqa: F401  (LengthBucketBatchSampler)
    import funasr_recipe.data.feats_dataset  # noqa: F401  (the Fbank* datasets)
    import funasr_recipe.data.index_ds  # noqa: F401  (IndexDSJsonlMmap)
    import funasr_recipe.model.conformer_ctc  # noqa: F401  (ConformerCTC)
    import funasr_recipe.model.sensevoice_tokenizer  # noqa: F401  (SenseVoiceTagTokenizer)
