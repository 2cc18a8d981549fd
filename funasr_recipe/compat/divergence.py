"""Divergence guard on funasr 1.4.16's trainer: every training step, on every rank, the loss is checked
(and the gradient, where it can be seen before the update); a bad step is skipped on all ranks, its
batch's utterance keys are logged, and after ``max_bad_steps`` bad steps in a row every rank stops with
advice. Neither funasr's DeepSpeed path nor the recipe looked at the loss: at ``++optim_conf.lr=1e3`` a
run died of an OverflowError in funasr's perplexity log line (``math.exp`` of the loss average).

A step is bad when, on any rank:
- its loss is not finite;
- its loss explodes: it is over FACTOR (10) x max(median of the last WINDOW (200) accepted steps'
  losses, FLOOR (1)). Only accepted steps enter the median, so a divergence cannot raise its own bar;
  the first step is judged for finiteness only (it has no reference), the second against the first.
  Ten times is far outside the spread of batches (a shuffled length bucket of a healthy run stays within
  a few times the median, a diverging one grows exponentially and crosses it within a few steps);
  the floor keeps a well-trained model's small per-token losses, where a hard batch is easily ten times
  the median, from being called exploding;
- its gradient is not finite. DDP: the norm of the gradients after backward, which DDP all-reduced (so
  it is the same number on every rank), before funasr's clip and step. DeepSpeed: the gradients are
  reduced into ZeRO's partitions only inside ``engine.step()``; there its optimizer checks them before
  it updates (bf16 ``check_grad_overflow``, on by default in 0.19.8, all-reduced over the ranks), skips
  the update and the schedule on every rank, and says so in ``was_step_applied()``; it is counted here
  after the step. With ``check_grad_overflow: false`` the update is applied, and shows in the next loss.
  Under fp16 with loss scaling (DeepSpeed's dynamic scale, torch's GradScaler under DDP) an inf gradient
  is the scaler's own search for a scale, skipped by it: not counted.

The losses reach every rank in one all-reduce of a float64 vector (one slot per rank) after forward,
so every rank takes the same decision from the same numbers. A bad step skips backward and the update on
every rank: under DeepSpeed neither ``engine.backward`` nor ``engine.step`` runs anywhere, so the engine's
micro-step, global-step and ZeRO counters stay equal across ranks (a skipped batch is no micro-step;
with gradient_accumulation_steps > 1 the window closes one batch later, on every rank); the bad batch
never produced a gradient. Under DDP the gradients are zeroed (the accumulation window's local,
unsynchronised part too). funasr's log line is not written for a skipped step, and its running loss
average gets the average itself (unchanged), so a bad loss never reaches ``math.exp``; that call also
saturates to inf now instead of raising, for a finite loss that is large but not judged bad.

Fault injection (tests; off unless set): FUNASR_RECIPE_FAULT="kind:step[:rank],..." with kind
``nan-input`` (NaN in the first utterance's features: a non-finite loss) or ``nan-grad`` (a finite loss
whose gradient is NaN), at funasr's total step ``step`` (1-based), on ``rank`` or every rank.

Reads FUNASR_RECIPE_FAULT, and on a bad step the training set's data.jsonl (funasr's index keeps each
utterance's source, not its key); writes log lines.

  install(max_bad_steps=10)  # after funasr_recipe.compat.hooks' wrappers, so that these run outside them
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch.utils.data import Dataset

from funasr_recipe.compat.patching import replace, wrap_method
from funasr_recipe.core.rejections import BadInputError

if TYPE_CHECKING:
    from funasr.train_utils.trainer_ds import Trainer

log = logging.getLogger(__name__)
FACTOR = 10.0
FLOOR = 1.0
WINDOW = 200
FAULT_ENV = "FUNASR_RECIPE_FAULT"
FAULT_KINDS = ("nan-input", "nan-grad")
SOURCE = "recipe_source"  # the batch entry with each utterance's source; taken out before the model sees it


class TrainingDiverged(RuntimeError):
    """``max_bad_steps`` bad steps in a row; the message says what to change."""


@dataclass
class LossRule:
    """Which ranks' losses make a step bad, against the losses of the steps accepted so far."""

    factor: float = FACTOR
    floor: float = FLOOR
    history: deque = field(default_factory=lambda: deque(maxlen=WINDOW))

    def limit(self) -> float | None:
        return self.factor * max(statistics.median(self.history), self.floor) if self.history else None

    def bad_ranks(self, losses: list[float]) -> list[int]:
        limit = self.limit()
        return [r for r, loss in enumerate(losses)
                if not math.isfinite(loss) or (limit is not None and loss > limit)]

    def describe(self, losses: list[float], ranks: list[int], shown: int = 8) -> str:
        """Why these ranks' losses are bad, in one line however many ranks there are."""
        limit = self.limit()
        parts = []
        nonfinite = [r for r in ranks if not math.isfinite(losses[r])]
        high = [r for r in ranks if math.isfinite(losses[r])]
        for group, what in ((nonfinite, "non-finite loss"),
                            (high, f"loss over {limit or 0:.4g} ({self.factor:g} x the median of the last "
                                   f"{len(self.history)} accepted steps, at least {self.floor:g})")):
            if group:
                listed = ", ".join(f"{r} ({losses[r]:.4g})" for r in group[:shown])
                more = f" and {len(group) - shown} more" if len(group) > shown else ""
                parts.append(f"{what} on rank {listed}{more}")
        return "; ".join(parts)

    def accept(self, losses: list[float]) -> None:
        self.history.append(statistics.median(losses))


@dataclass(frozen=True)
class Fault:
    kind: str
    step: int
    rank: int | None  # None: every rank


def parse_faults(text: str) -> list[Fault]:
    """The faults FUNASR_RECIPE_FAULT asks for; a malformed value is an error, not silently no fault."""
    faults = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        parts = item.split(":")
        if parts[0] not in FAULT_KINDS or len(parts) not in (2, 3) or not all(p.isdigit() for p in parts[1:]):
            raise BadInputError(f"{FAULT_ENV}={text!r}: each fault is kind:step[:rank] with kind one of "
                                f"{', '.join(FAULT_KINDS)}")
        faults.append(Fault(parts[0], int(parts[1]), int(parts[2]) if len(parts) == 3 else None))
    return faults


class WithSources:
    """A dataset's ``__getitems__`` (torch's fetcher prefers it to one call per index) whose samples also
    carry their source: funasr's collators pass a non-tensor entry through as a list, and SenseVoice's
    cuts it with the rest when it halves an oversized batch. A class, not a closure: a worker started by
    spawn gets the dataset pickled."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __call__(self, indices: list[int]) -> list:
        out = []
        for i in indices:
            sample = self.dataset[i]
            if isinstance(sample, dict):  # funasr's raw datasets give None for audio they cannot load
                sample = {**sample, SOURCE: self.dataset.index_ds[i]["source"]}
            out.append(sample)
        return out


def carry_sources(dataset: Dataset) -> bool:
    """Make the training loader's batches carry their sources; False where the dataset cannot."""
    if isinstance(dataset.__dict__.get("__getitems__"), WithSources):
        return True
    if hasattr(type(dataset), "sources_key"):  # the recipe's stage-1 datasets batch their own sources
        dataset.sources_key = SOURCE
        return True
    if hasattr(type(dataset), "__getitems__") or not hasattr(dataset, "index_ds"):
        return False
    dataset.__getitems__ = WithSources(dataset)
    return True


def keys_of(jsonl: str | None, sources: list[str]) -> list[str]:
    """The keys of the utterances with these sources, in their order (the source where none is found).
    A scan of the set's data.jsonl, only on a bad step: a map of a large set held on every rank for the
    whole run would cost more memory than a rare scan costs time."""
    found: dict[str, str] = {}
    wanted = set(sources)
    if jsonl and os.path.isfile(jsonl):
        with open(jsonl, encoding="utf-8") as f:
            for line in f:
                entry = json.loads(line)
                if entry.get("source") in wanted and "key" in entry:
                    found[entry["source"]] = entry["key"]
    return [found.get(s, s) for s in sources]


def _all_losses(loss: torch.Tensor) -> list[float]:
    """Every rank's loss of this step, in rank order, on every rank."""
    value = loss.detach().double().reshape(())
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [float(value)]
    vec = torch.zeros(dist.get_world_size(), dtype=torch.float64, device=loss.device)
    vec[dist.get_rank()] = value
    # Not through the hooks' collective timer (funasr_recipe/train/collectives.py): it measures gradient
    # synchronisation, and this call also waits for the slowest rank's forward.
    all_reduce = dist.all_reduce
    if all_reduce.__code__.co_filename.endswith(os.path.join("train", "collectives.py")):
        all_reduce = all_reduce.__wrapped__
    all_reduce(vec)
    return vec.tolist()


class _SaturatingMath:
    """``math`` for funasr's trainer module, whose log line formats ``math.exp`` of the loss average (its
    perplexity): over 709.78 that raised OverflowError and ended the run; now it is inf."""

    def __getattr__(self, name: str) -> object:
        return getattr(math, name)

    @staticmethod
    def exp(x: float) -> float:
        try:
            return math.exp(x)
        except OverflowError:
            return math.inf


@dataclass
class Guard:
    max_bad_steps: int  # 0: never stop
    faults: list[Fault] = field(default_factory=list)
    rule: LossRule = field(default_factory=LossRule)
    lr: object = None      # the configured peak learning rate and warmup, for the advice
    warmup: object = None
    jsonl: str | None = None
    streak: int = 0
    bad: bool = False      # this step is skipped
    hide_log: bool = False
    sources: list[str] | None = None
    losses: list[float] = field(default_factory=list)

    def keys(self, only: list[int] | None = None) -> list[str]:
        if self.sources is None:
            return ["(keys unknown: the dataset carries no sources)"]
        return keys_of(self.jsonl, self.sources if only is None else [self.sources[i] for i in only])

    def flag(self, step: int, cause: str, own_batch_bad: bool, speech: torch.Tensor | None) -> None:
        """Mark this step bad on this rank (every rank calls it for the same step); stop after a streak."""
        self.bad = True
        self.streak += 1
        what = f"bad step {step} ({self.streak} in a row): {cause}; skipped on every rank"
        if own_batch_bad:
            keys = self.keys()
            what += f". This rank's batch ({len(keys)} utterances): {' '.join(keys)}"
            if speech is not None and speech.is_floating_point() and len(keys) == len(speech):
                finite = torch.isfinite(speech).flatten(1).all(1).tolist()
                broken = [key for key, ok in zip(keys, finite, strict=True) if not ok]
                if broken:
                    what += f"; non-finite features in {' '.join(broken)}"
        log.warning("%s", what)
        if self.max_bad_steps and self.streak >= self.max_bad_steps:
            message = self.advice(step, cause)
            log.error("%s", message)
            raise TrainingDiverged(message)

    def advice(self, step: int, cause: str) -> str:
        lr = (f"++optim_conf.lr={self.lr / 10:g} (now {self.lr:g})" if isinstance(self.lr, (int, float))
              else "++optim_conf.lr=<lower>")
        warm = (f"++scheduler_conf.warmup_steps={2 * int(self.warmup)} (now {self.warmup})"
                if isinstance(self.warmup, (int, float)) else "++scheduler_conf.warmup_steps=<more steps>")
        return (f"training diverged: {self.streak} bad steps in a row, the last step {step} ({cause}); each "
                f"was skipped on every rank. Lower the learning rate: {lr}; warm up longer: {warm}; and "
                "check the utterances named in the 'bad step' lines above (features or a transcript that "
                "give a non-finite loss every time they come up). --max-bad-steps 0 never stops.")

    def discard(self, trainer: Trainer, optim: torch.optim.Optimizer | None, loss_dict: dict) -> None:
        """After a bad step: nothing of it in the gradients, funasr's running averages, or its log."""
        if not trainer.use_deepspeed:
            optim.zero_grad(set_to_none=True)
        first = loss_dict["batch_idx"] == 0  # the averages restart each epoch: nothing to keep yet
        typical = statistics.median(self.rule.history) if self.rule.history else 0.0
        loss_dict["loss"] = torch.tensor(typical if first else trainer.train_loss_avg)
        if "acc" in loss_dict.get("stats", {}):
            loss_dict["stats"]["acc"] = torch.tensor(0.0 if first else trainer.train_acc_avg)
        self.hide_log = True


_guard: Guard | None = None


def install(max_bad_steps: int) -> Guard:
    """Wrap the Trainer's methods (once per process), outside any wrappers already there."""
    global _guard
    if _guard is not None:
        return _guard
    from funasr.train_utils import trainer_ds

    guard = _guard = Guard(max_bad_steps, parse_faults(os.environ.get(FAULT_ENV, "")))
    replace(trainer_ds, "math", _SaturatingMath())
    Trainer = trainer_ds.Trainer

    wrap = functools.partial(wrap_method, Trainer)

    @wrap("warp_optim_scheduler")  # warp_model is not reached under DDP on CPU (compat/cpu.py)
    def _(original, self, model, **kwargs):
        guard.lr = (kwargs.get("optim_conf") or {}).get("lr")
        guard.warmup = (kwargs.get("scheduler_conf") or {}).get("warmup_steps")
        guard.jsonl = kwargs.get("train_data_set_list")
        return original(self, model, **kwargs)

    @wrap("train_epoch")
    def _(original, self, *args, **kwargs):
        loader = kwargs.get("dataloader_train")
        if loader is not None and not carry_sources(loader.dataset):
            log.warning("divergence guard: %s has its own __getitems__ or no index: a bad step's keys "
                        "are not known", type(loader.dataset).__name__)
        optimizer = getattr(kwargs.get("model"), "optimizer", None)
        if self.use_deepspeed and getattr(optimizer, "check_grad_overflow", True) is False:
            log.warning("DeepSpeed's check_grad_overflow is off: a non-finite gradient is applied, and "
                        "is seen only in the next step's loss")
        return original(self, *args, **kwargs)

    @wrap("forward_step")
    def _(original, self, model, batch, loss_dict=None):
        sources = batch.pop(SOURCE, None)
        if not model.training:
            return original(self, model, batch, loss_dict=loss_dict)
        guard.bad, guard.sources = False, sources
        step = loss_dict["batch_total"]
        mine = [f.kind for f in guard.faults if f.step == step and f.rank in (None, self.rank)]
        if "nan-input" in mine:
            batch["speech"][0, 0, 0] = math.nan
            log.warning("fault injection (%s): NaN in the features of %s, step %d", FAULT_ENV,
                        guard.keys([0])[0], step)
        out = original(self, model, batch, loss_dict=loss_dict)
        if "nan-grad" in mine:
            loss_dict["loss"].register_hook(lambda grad: grad * math.nan)
            log.warning("fault injection (%s): NaN gradient from step %d's loss", FAULT_ENV, step)
        guard.losses = _all_losses(loss_dict["loss"])
        ranks = guard.rule.bad_ranks(guard.losses)
        if ranks:
            cause = guard.rule.describe(guard.losses, ranks)
            guard.flag(step, cause, self.rank in ranks, batch.get("speech"))
        return out

    @wrap("backward_step")
    def _(original, self, model, scaler, loss_dict=None):
        if not guard.bad:
            return original(self, model, scaler, loss_dict=loss_dict)
        return None

    @wrap("update_step")
    def _(original, self, model, optim, scheduler, scaler, loss_dict=None):
        step = loss_dict["batch_total"]
        # Under fp16 an inf gradient is how the loss scaler (torch's GradScaler under DDP, DeepSpeed's
        # dynamic scale) finds its scale: it skips that update itself and lowers the scale. Counting it
        # would stop a healthy run in its first steps; a real divergence still shows in the loss.
        scaled = (getattr(scaler, "is_enabled", lambda: False)() if not self.use_deepspeed
                  else model.fp16_enabled() and model.dynamic_loss_scale())
        boundary = (model.is_gradient_accumulation_boundary() if self.use_deepspeed
                    else (loss_dict["batch_idx"] + 1) % self.accum_grad == 0)
        if not guard.bad and not self.use_deepspeed and boundary and not scaled:
            grads = [p.grad for p in model.parameters() if p.grad is not None]
            norm = float(torch.nn.utils.get_total_norm(grads)) if grads else 0.0
            if not math.isfinite(norm):
                guard.flag(step, f"non-finite gradient norm {norm}", True, None)
        if guard.bad:
            guard.discard(self, optim, loss_dict)
            return None
        out = original(self, model, optim, scheduler, scaler, loss_dict=loss_dict)
        if self.use_deepspeed and boundary and not scaled and not model.was_step_applied():
            guard.flag(step, "non-finite gradient (DeepSpeed skipped the update)", True, None)
            guard.discard(self, optim, loss_dict)
            return out
        guard.rule.accept(guard.losses)
        guard.streak = 0
        return out

    @wrap("log")
    def _(original, self, loss_dict=None, tag="train", **kwargs):
        if tag == "train" and guard.hide_log:
            guard.hide_log = False
            return None
        return original(self, loss_dict, tag=tag, **kwargs)

    stop = f"{max_bad_steps} in a row stop training" if max_bad_steps else "never stops (--max-bad-steps 0)"
    log.info("divergence guard: a non-finite loss or gradient, or a loss over %g x the recent median, "
             "skips the step; %s", FACTOR, stop)
    return guard
