"""Dry-run of every model config (conf/*.yaml): valid for funasr, model built, one batch trained.

For each config: the training sections (dataset, sampler, trainer, optimiser, scheduler, frontend,
DeepSpeed JSON) name things funasr knows and hold values its trainer accepts; then the model is built
the way funasr's ``AutoModel.build_model`` builds it, with tiny dimensions substituted for the
GPU-sized ones (TINY), and one batch of random LFR-stacked fbank with targets laid out as the
config's dataset lays them out goes forward and backward, followed by one optimiser and scheduler step.

A fine-tuning config (``pretrained_model`` set, no ``model_conf``) names no architecture: funasr merges
it over the released model's config.yaml. There is no hub here: funasr_recipe/model/released.py holds
the parts of those config.yaml files that matter (architecture, and the training values the recipe must
override).

Reads conf/*.yaml and ds_configs/*.json; writes nothing.

  .venv/bin/python -m pytest tests/unit/model/test_configs.py -q
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from funasr.optimizers import optim_classes
from funasr.register import tables
from funasr.schedulers import scheduler_classes
from omegaconf import DictConfig, OmegaConf

from funasr_recipe.data.batching import SourceLengths
from funasr_recipe.data.feats_dataset import FBANK_DATASETS
from funasr_recipe.model.architecture import build_model, frontend_of, resolved
from funasr_recipe.model.config import fbank_conf, load_config, pretrained_model, tokenizer_spec
from funasr_recipe.model.released import released_config
from funasr_recipe.model.tokenizer import KINDS
from funasr_recipe.model.trainer import register_recipe_classes
from funasr_recipe.train import lr_schedule
from tests.helpers.configs import ROOT, TINY, random_batch

# The recipe's classes and schedule in funasr's registry, as stage 2 puts them there before training.
register_recipe_classes()
lr_schedule.register()

CONFIGS = sorted((ROOT / "conf").glob("*.yaml"))

# GPU-sized dimensions -> CPU-sized ones, for whichever of these keys a section has. A config whose
# encoder is at most CPU_WIDTH wide (the tiny_*.yaml ones) is run at its own size.
CPU_WIDTH = 128




def shrink(cfg: DictConfig) -> DictConfig:
    """A copy of ``cfg`` with the TINY dimensions in place of a GPU-sized config's own."""
    small = copy.deepcopy(cfg)
    if cfg.encoder_conf.output_size <= CPU_WIDTH:
        return small
    for section, sizes in TINY.items():
        conf = small.get(section)
        for key, value in sizes.items():
            if conf is not None and key in conf:
                conf[key] = min(value, conf[key]) if key == "tp_blocks" else value
    return small








def test_the_configs_are_found() -> None:
    names = {p.stem for p in CONFIGS}
    assert {"tiny_sensevoice", "sensevoice_small", "paraformer", "tiny_paraformer"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_recipe_keys(path: Path) -> None:
    """What the recipe's own stages read: the frontend (stage 1), and the tokenizer or the model to
    fine-tune (stages 1 and 2)."""
    raw = load_config(path)
    fbank = fbank_conf(raw)  # stage 1 computes exactly this fbank
    assert raw.frontend_conf.n_mels == fbank.n_mels
    if pretrained_model(raw):
        assert "model_conf" not in raw, f"{path.name}: model_conf makes funasr skip the pretrained model"
        assert "build_tokenizer" not in raw, f"{path.name}: a fine-tune keeps the released tokenizer"
        released = released_config(raw.model).frontend_conf  # fails naming the model if none is recorded
        for key, value in raw.frontend_conf.items():
            assert released.get(key, value) == value, f"{path.name}: frontend_conf.{key} differs from release"
    else:
        assert "model_conf" in raw, f"{path.name}: without model_conf funasr downloads {raw.model} from a hub"
        spec = tokenizer_spec(raw)
        assert spec is not None and spec["kind"] in KINDS, f"{path.name}: build_tokenizer kind not in {KINDS}"
        assert raw.tokenizer in tables.tokenizer_classes, raw.tokenizer
        assert "bpemodel" not in raw.tokenizer_conf, f"{path.name}: stage 2 sets tokenizer_conf.bpemodel"
        assert "cmvn_file" not in raw.frontend_conf, f"{path.name}: stage 2 sets frontend_conf.cmvn_file"


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_training_sections(path: Path) -> None:
    """Names registered with funasr, and values its trainer accepts (after the merge, for fine-tunes)."""
    cfg, _ = resolved(path)
    ds = cfg.dataset_conf
    assert cfg.dataset in tables.dataset_classes, cfg.dataset
    assert FBANK_DATASETS.get(cfg.dataset) in tables.dataset_classes, f"no stage-1 variant of {cfg.dataset}"
    assert ds.index_ds in tables.index_ds_classes, ds.index_ds
    assert ds.batch_sampler in tables.batch_sampler_classes, ds.batch_sampler
    assert ds.batch_type == "token", "batch_size is documented as padded fbank frames: batch_type token"
    assert ds.data_split_num == 1, "one jsonl per set: data_split_num > 1 repeats it within an epoch"
    assert ds.get("min_source_length", 0) <= 1, "short clips would be dropped without a word"
    assert ds.max_token_length < ds.batch_size, "an utterance longer than batch_size cannot be batched"
    tc = cfg.train_conf
    assert tc.validate_interval > 0 and tc.save_checkpoint_interval > 0, "funasr divides by these"
    assert tc.avg_keep_nbest_models_type == "loss", "SenseVoice and CTC models report no plain acc"
    assert 0 < tc.avg_nbest_model <= tc.keep_nbest_models
    assert tc.use_deepspeed is True
    ds_json = ROOT / tc.deepspeed_config
    assert ds_json.is_file() and ds_json.parent.name == "ds_configs", tc.deepspeed_config
    assert json.loads(ds_json.read_text())["zero_optimization"]["stage"] in (1, 2, 3)
    assert cfg.optim in optim_classes, f"optim {cfg.optim} not in {sorted(optim_classes)}"
    assert cfg.scheduler in scheduler_classes, f"scheduler {cfg.scheduler} not in {sorted(scheduler_classes)}"
    assert 0 < cfg.optim_conf.lr <= 0.005


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_batch_sampler_cuts_batches(path: Path) -> None:
    """The configured sampler accepts the config's dataset_conf and yields batches of valid indices."""
    cfg, _ = resolved(path)
    conf = {**OmegaConf.to_container(cfg.dataset_conf, resolve=True), "is_training": True,
            "rank": 0, "world_size": 1, "num_workers": 0}
    data = SourceLengths([50 + (37 * i) % 900 for i in range(200)], [5] * 200)
    args = tables.batch_sampler_classes.get(cfg.dataset_conf.batch_sampler)(data, **conf)
    sampler = args["batch_sampler"]
    sampler.set_epoch(0)
    batches = list(sampler)
    assert batches and all(batch for batch in batches)
    assert {i for batch in batches for i in batch} <= set(range(len(data)))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_model_trains_one_step(path: Path) -> None:
    """Tiny dimensions, one random batch: finite loss, finite gradients, one optimiser step."""
    cfg, vocab_size = resolved(path)
    lfr_m, n_mels = cfg.frontend_conf.get("lfr_m", 1), cfg.frontend_conf.n_mels
    if pretrained_model(cfg):
        assert n_mels * lfr_m == 560, "the released encoder takes 80 mel bins x 7 stacked frames"
    if "predictor_conf" in cfg:
        assert cfg.predictor_conf.idim == cfg.encoder_conf.output_size, "predictor idim != encoder width"
    if "decoder_conf" in cfg and "att_layer_num" in cfg.decoder_conf:
        assert cfg.decoder_conf.att_layer_num <= cfg.decoder_conf.num_blocks, "att_layer_num > num_blocks"
    if cfg.get("specaug") == "SpecAugLFR":
        assert cfg.specaug_conf.lfr_rate == cfg.frontend_conf.lfr_n, "SpecAugLFR lfr_rate != lfr_n"
    small = shrink(cfg)
    torch.manual_seed(0)
    model = build_model(small, vocab_size)
    input_size = frontend_of(small).output_size()
    assert input_size == n_mels * lfr_m
    model.train()
    loss, stats, weight = model(**random_batch(small, input_size, vocab_size))
    assert torch.isfinite(loss), stats
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)

    optim = optim_classes[small.optim](model.parameters(), **small.optim_conf)
    scheduler = scheduler_classes[small.scheduler](optim, **small.scheduler_conf)
    before = [p.detach().clone() for p in model.parameters()]
    optim.step()
    scheduler.step()
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))
