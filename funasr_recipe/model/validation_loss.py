"""The validation loss of a model's weights on its training run's validation set, computed as funasr's
trainer computes it after every epoch: stage 3 compares the average of the best checkpoints with the
best one (funasr_recipe/model/averaging.py) before it calls the average the result.

Reads  <exp-dir>/config.yaml (the validation set as stage 2 used it: ``valid_data_set_list``, ``dataset``,
       ``dataset_conf``), that list and the features or audio it names, and a model dir in the hub's layout
       (make_model_dir's: model, frontend and tokenizer, opened as decoding opens them); writes nothing.

The loss is funasr's validation loss (``Trainer.validate_epoch``): the model in eval mode, no gradients,
``loss, stats, weight = model(**batch)`` on each batch of the validation DataLoader funasr builds
(``DataloaderMapStyle.build_iter``: the config's dataset class with ``is_training=False`` and its batch
sampler), averaged over batches with equal weight. What differs, and is the same for every candidate:
one process (funasr averages each rank's mean over the ranks; a sampler that pads the batch list to a
multiple of the world size repeats a batch or two there), fp32 weights without autocast (a DeepSpeed bf16
run validated its bf16 module copies under autocast), and the frontend's dither off. So the recorded
losses are not comparable with these: ``ValidationLoss`` scores every candidate itself, in one run.
Each pass starts from the same seed (``SEED``; the caller's CPU generator is restored afterwards): a
model's forward may draw even in eval mode (SenseVoiceSmall's encoder replaces the language query of 20%
of the utterances with "unknown", ``torch.rand(1) > 0.2``), and two candidates must see the same draws,
or noise decides between them (0.2% of the loss apart on 6 utterances for the same weights).

  scorer = ValidationLoss(Path("exp/x/final"), valid_set(Path("exp/x")), device="cpu")
  loss = scorer(state_dict, "model.pt.avg4")
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from funasr_recipe.core.log import Progress
from funasr_recipe.core.rejections import BadInputError
from funasr_recipe.model.model_dir import load_automodel

log = logging.getLogger(__name__)

SEED = 0  # of every validation pass (module docstring)


@dataclass(frozen=True)
class ValidSet:
    """The validation data of a training run, as its config.yaml gives it to funasr's dataloader."""

    data_list: Path  # valid_data_set_list: a jsonl of stage 1 (or 0, with --feats-type raw)
    dataset: str  # a dataset_classes name
    dataset_conf: dict[str, Any]


class NoValidSet(BadInputError):
    """The run's config names no validation set (only a hand-made config: stage 2 always gives one)."""


def valid_set(exp_dir: Path) -> ValidSet:
    """The validation set stage 2 trained ``exp_dir`` with (its resolved config, <exp-dir>/config.yaml)."""
    config = exp_dir / "config.yaml"
    if not config.is_file():
        raise FileNotFoundError(f"{config}: no resolved config; has stage 2 run in {exp_dir}?")
    cfg = OmegaConf.to_container(OmegaConf.load(config), resolve=True)
    listed = cfg.get("valid_data_set_list")
    if not listed:
        raise NoValidSet(f"{config}: no valid_data_set_list, the validation set stage 2 used")
    data_list = Path(listed)
    if not data_list.is_file():
        raise FileNotFoundError(f"{data_list}: the validation set of {config} is gone (stage 3 scores the "
                                "average on it); rerun stage 1, or restore it")
    conf = dict(cfg.get("dataset_conf") or {})
    if not conf.get("batch_sampler", "BatchSampler"):
        raise BadInputError(f"{config}: dataset_conf.batch_sampler is empty; funasr's trainer needs one too")
    return ValidSet(data_list, str(cfg.get("dataset", "AudioDataset")), conf)


class ValidationLoss:
    """A model dir's model and a validation set's batches, built once; calling it with a state dict loads
    those weights into the model and returns their validation loss (``math.inf`` when a batch's loss is
    not finite: funasr then records none). The weights must name exactly the model's parameters."""

    def __init__(self, model_dir: Path, valid: ValidSet, device: str = "cpu",
                 threads: int | None = None) -> None:
        from funasr.register import tables

        from funasr_recipe.model.trainer import register_recipe_classes

        register_recipe_classes()  # the recipe's datasets and batch sampler, which a config may name
        automodel = load_automodel(model_dir, device=device, threads=threads)
        self.model: torch.nn.Module = automodel.model
        # Where AutoModel put it (it falls back to the CPU when the device asked for is not there).
        self.device = next(self.model.parameters()).device
        dataset_class = tables.dataset_classes.get(valid.dataset)
        if dataset_class is None:
            raise BadInputError(f"dataset {valid.dataset}: not a funasr dataset class (the config's dataset)")
        conf = valid.dataset_conf
        # As DataloaderMapStyle builds its validation loader (funasr/datasets/dataloader_entry.py).
        self.dataset = dataset_class(str(valid.data_list), frontend=automodel.kwargs.get("frontend"),
                                     tokenizer=automodel.kwargs.get("tokenizer"), is_training=False, **conf)
        sampler = tables.batch_sampler_classes.get(conf.get("batch_sampler", "BatchSampler"))
        if sampler is None:
            raise BadInputError(f"batch sampler {conf.get('batch_sampler')}: not a funasr batch sampler")
        loader_args = sampler(self.dataset, is_training=False, **conf)
        loader_args["batch_sampler"].set_epoch(0)  # validation neither shuffles nor draws
        if self.device.type == "cpu":
            loader_args["pin_memory"] = False  # nothing to pin for; torch warns on every batch otherwise
        # Its workers stay up between candidates (persistent_workers, as funasr sets it): one start, not one
        # per candidate.
        self.loader = torch.utils.data.DataLoader(self.dataset, collate_fn=self.dataset.collator,
                                                  **loader_args)
        self.valid = valid

    def __call__(self, state: dict[str, torch.Tensor], label: str) -> float:
        """The validation loss of ``state`` (``label`` names it in the log)."""
        from funasr.train_utils.device_funcs import to_device

        missing, unexpected = self.model.load_state_dict(state, strict=False)
        if missing or unexpected:
            # Both candidates come from the same run: a mismatch means the weights are not this model's.
            raise BadInputError(f"{label}: its weights do not fit the model ({len(missing)} missing, e.g. "
                                f"{missing[:3]}; {len(unexpected)} unexpected, e.g. {unexpected[:3]})")
        self.model.eval()
        total, batches, bad = 0.0, 0, None
        progress = Progress(f"validation loss of {label} on {self.valid.data_list}", len(self.loader),
                            unit="batch", logger=log)
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(SEED)
            for i, batch in enumerate(self.loader):
                loss, _stats, _weight = self.model(**to_device(batch, self.device))
                value = float(loss.detach().float().cpu())
                if not math.isfinite(value) and bad is None:
                    bad = i
                total += value
                batches += 1
                progress.update()
        progress.close()
        if batches == 0:
            raise BadInputError(f"{self.valid.data_list}: no validation batch (every utterance filtered "
                                "out?); the average cannot be checked")
        if bad is not None:
            log.warning("%s: the loss of validation batch %d is not finite", label, bad)
            return math.inf
        return total / batches

    def close(self) -> None:
        """Stop the DataLoader's workers."""
        self.loader = None  # type: ignore[assignment]  # the iterator's workers go with the loader
