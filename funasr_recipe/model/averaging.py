"""Stage 3's model: the average of a training run's best checkpoints, in fp32, unless it is worse on the
validation set than the best checkpoint alone.

Reads  <exp-dir>/model.pt (funasr's latest checkpoint: its ``saved_ckpts`` maps each kept checkpoint to
       its validation loss; under ZeRO-3 in rank 0's model-states file) and the chosen checkpoints' fp32
       weights (funasr_recipe/model/checkpoint.py, from ZeRO-1/2/3 shards alike, each merged with its
       LoRA adapters first: funasr_recipe/model/adapters.py); for the check, the
       validation set of <exp-dir>/config.yaml (funasr_recipe/model/validation_loss.py);
writes <exp-dir>/model.pt.avg<k> (``average``: a plain fp32 state dict of the k checkpoints averaged),
       removes every other <exp-dir>/model.pt.avg<n>, and ``finalize`` writes the final model dir
       (make_model_dir's layout; its configuration.json "recipe" says what it is made of and why).

Which checkpoints (``plan``): the ``num`` with the lowest recorded validation loss that are still on
disk, less every one whose loss is more than ``margin`` (default ``LOSS_MARGIN``, 1.0: 100%) of the best's
loss above the best's: loss > best + margin * |best|. A 4-epoch run that kept epoch 1 (loss 19.85) beside
epoch 4 (0.65) averaged it in, and the average decoded nothing; an early checkpoint that far off is no
neighbour of the best in weight space, and its mean with the best lands between the two, not near
either. Averaging pays for checkpoints near the same minimum, whose losses are close.

The check (``finalize``): the rule above is a filter on recorded numbers; the average itself has none.
So its validation loss and the best checkpoint's are computed, the same way in the same run, and final
is the average only when its loss is not higher; otherwise final is the best checkpoint, the log says so
and configuration.json records both losses.

Why not funasr's own average: at the end of training funasr averages the bf16 module copies of
DeepSpeed checkpoints (its ``model.pt.avg<n>``, named after the count asked for, not the count it found:
``model.pt.avg5`` of 4 checkpoints, epoch 1 included); the optimizer's fp32 masters are the weights
training actually holds, and averaging bf16 copies rounds every weight to 8 bits of mantissa first.

  path, names, losses = average(Path("exp/tiny_sensevoice"), num=5)
  outcome = finalize(Path("exp/tiny_sensevoice"), 5, Path("exp/tiny_sensevoice/final"))
"""

from __future__ import annotations

import json
import logging
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from funasr_recipe.core.files import write_atomic
from funasr_recipe.core.rejections import BadInputError
from funasr_recipe.model.adapters import finish_state_dict
from funasr_recipe.model.checkpoint import client_state_file, fp32_state_dict, safe_load
from funasr_recipe.model.defaults import LOSS_MARGIN
from funasr_recipe.model.model_dir import make_model_dir
from funasr_recipe.model.validation_loss import NoValidSet, ValidationLoss, ValidSet, valid_set

log = logging.getLogger(__name__)

_AVERAGE = re.compile(r"model\.pt\.avg\d+")


def validation_losses(exp_dir: Path) -> dict[str, float]:
    """Checkpoint name -> validation loss, as funasr's trainer recorded them in its latest checkpoint."""
    latest = exp_dir / "model.pt"
    if not latest.exists():
        raise FileNotFoundError(f"{latest}: no latest checkpoint; has stage 2 finished an epoch?")
    state_file = client_state_file(latest)  # ZeRO-3 partitions it: rank 0's file
    state = safe_load(state_file)
    losses = state.get("saved_ckpts") or state.get("val_loss_step_or_epoch") or {}
    if state.get("avg_keep_nbest_models_type", "loss") != "loss":
        # With "acc", saved_ckpts holds accuracies: the lowest would be the worst.
        raise BadInputError(f"{state_file}: checkpoints were kept by {state['avg_keep_nbest_models_type']}; "
                            "set train_conf.avg_keep_nbest_models_type=loss (docs/design.md, \"Checkpoint "
                            "selection and averaging\", says why)")
    return {name: float(loss) for name, loss in losses.items()}


def select_best(losses: dict[str, float], num: int, exp_dir: Path) -> list[str]:
    """The ``num`` checkpoints with the lowest loss that are still on disk, best first."""
    present = {name: loss for name, loss in losses.items() if (exp_dir / name).exists()}
    if gone := sorted(set(losses) - set(present)):
        log.warning("%d recorded checkpoints are no longer on disk (%s); choosing among the rest",
                    len(gone), ", ".join(gone[:5]))
    if not present:
        raise FileNotFoundError(f"{exp_dir}: none of the recorded checkpoints exists ({sorted(losses)})")
    # A non-finite record sorts last (NaN would otherwise compare false with everything).
    return sorted(present, key=lambda name: (not math.isfinite(present[name]), present[name], name))[:num]


def leave_out_far(losses: dict[str, float], names: list[str],
                  margin: float = LOSS_MARGIN) -> tuple[list[str], dict[str, str]]:
    """(``names`` without those far from the best, best first; each left out -> why). ``names`` is best
    first, as ``select_best`` gives it; far: loss > best + margin * |best|, or not finite."""
    if margin < 0:
        raise BadInputError(f"the loss margin must not be negative, got {margin}")
    best = losses[names[0]]
    if not math.isfinite(best):
        raise BadInputError(f"no checkpoint has a finite validation loss ({names[0]}: {best})")
    limit = best + margin * abs(best)
    kept, left_out = [], {}
    for name in names:
        loss = losses[name]
        if math.isfinite(loss) and loss <= limit:
            kept.append(name)
        else:
            left_out[name] = (f"validation loss {loss:.4g} is more than {margin:.0%} above the best's "
                              f"({names[0]}: {best:.4g}; limit {limit:.4g})")
    return kept, left_out


@dataclass(frozen=True)
class Plan:
    """What stage 3 averages: ``names`` (best first), the recorded losses, and what was left out and why."""

    names: list[str]
    losses: dict[str, float]
    left_out: dict[str, str] = field(default_factory=dict)


def plan(exp_dir: Path, num: int, margin: float = LOSS_MARGIN) -> Plan:
    """The checkpoints to average (module docstring), each choice logged."""
    if num < 1:
        raise BadInputError(f"the number of checkpoints to average must be positive, got {num}")
    losses = validation_losses(exp_dir)
    names, left_out = leave_out_far(losses, select_best(losses, num, exp_dir), margin)
    for name, why in left_out.items():
        log.warning("leaving %s out of the average: %s", name, why)
    if len(names) + len(left_out) < num:
        log.warning("only %d checkpoints to choose from (asked for %d)", len(names) + len(left_out), num)
    if len(names) > 1:  # one is no average: finalize says so
        log.info("averaging %s (recorded validation loss %s)", ", ".join(names),
                 ", ".join(f"{losses[n]:.4g}" for n in names))
    return Plan(names, losses, left_out)


def average_fp32(exp_dir: Path, names: list[str]) -> dict[str, torch.Tensor]:
    """Element-wise mean of the checkpoints' fp32 weights (accumulated in fp64); integer tensors
    (BatchNorm's num_batches_tracked) are taken from the first, the best. Each checkpoint of a run with
    LoRA adapters is merged first: the mean of B A over checkpoints is not mean(B) mean(A)."""
    total: dict[str, torch.Tensor] = {}
    for i, name in enumerate(names):
        state = finish_state_dict(exp_dir, fp32_state_dict(exp_dir, name))
        if i == 0:
            total = {k: v.double() if v.is_floating_point() else v.clone() for k, v in state.items()}
            continue
        if state.keys() != total.keys():
            raise BadInputError(f"{exp_dir / name} has other parameters than {exp_dir / names[0]}")
        for k, v in state.items():
            if v.is_floating_point():
                total[k] += v.double()
    return {k: (v / len(names)).float() if v.is_floating_point() else v for k, v in total.items()}


def write_average(exp_dir: Path, names: list[str]) -> Path:
    """<exp-dir>/model.pt.avg<k> of the k ``names``; every other model.pt.avg<n> there is removed."""
    out = exp_dir / f"model.pt.avg{len(names)}"
    torch.save(average_fp32(exp_dir, names), out)
    remove_other_averages(exp_dir, keep=out)
    return out


def remove_other_averages(exp_dir: Path, keep: Path | None = None) -> list[Path]:
    """Remove every <exp-dir>/model.pt.avg<n> file but ``keep``; returns them.

    Removed, not renamed or kept: funasr's end-of-training model.pt.avg<n> (and an earlier stage 3's with
    another count) sits beside ours under the same kind of name, so it reads as a result of this run; it
    is not one. funasr's averages the bf16 copies of its own choice (no margin, no check) and is named
    after the count asked for, not the one averaged. Nothing reads it, it can be made again (stage 3 with
    that count), and a renamed copy would keep a model's worth of disk for a file nobody should decode.
    Ours overwrites one of the same name; this removes the rest."""
    removed = []
    for path in sorted(exp_dir.glob("model.pt.avg*")):
        if _AVERAGE.fullmatch(path.name) and path.is_file() and path != keep:
            path.unlink()
            removed.append(path)
    if removed:
        log.info("removed %s: not this stage 3's average (funasr's end-of-training one, or an earlier "
                 "count's)", ", ".join(p.name for p in removed))
    return removed


def average(exp_dir: Path, num: int, margin: float = LOSS_MARGIN) -> tuple[Path, list[str], dict[str, float]]:
    """Write model.pt.avg<k> (k = how many were averaged, at most ``num``: ``plan``'s); returns its path,
    the names averaged (best first) and every recorded validation loss."""
    chosen = plan(exp_dir, num, margin)
    return write_average(exp_dir, chosen.names), chosen.names, chosen.losses


def average_wins(average_loss: float, best_loss: float) -> bool:
    """Whether final is the average: its validation loss is finite and not above the best checkpoint's
    (or the best's is not finite)."""
    return math.isfinite(average_loss) and (average_loss <= best_loss or not math.isfinite(best_loss))


@dataclass
class Outcome:
    """What final is made of: ``checkpoint`` (model.pt.avg<k>, or the best checkpoint), and for its
    configuration.json ``info()``."""

    checkpoint: str
    chosen: Plan
    validation: dict[str, Any]

    def info(self) -> dict[str, Any]:
        """make_model_dir's ``info``: the checkpoints averaged with their recorded losses, those left out
        and why, and the check (each candidate's validation loss, the choice and why)."""
        return {"averaged": {n: self.chosen.losses[n] for n in self.chosen.names},
                "left_out": self.chosen.left_out, "validation": self.validation}


def _record(final: Path, info: dict[str, Any]) -> None:
    """Put ``info`` into final's configuration.json "recipe" (make_model_dir wrote it before the check)."""
    path = final / "configuration.json"
    configuration = json.loads(path.read_text(encoding="utf-8"))
    configuration["recipe"].update(info)
    write_atomic(path, json.dumps(configuration, indent=2) + "\n")


def finalize(exp_dir: Path, num: int, final: Path, margin: float = LOSS_MARGIN, check: bool = True,
             device: str = "cpu", threads: int | None = None) -> Outcome:
    """Average, check, and write ``final`` from the average or from the best checkpoint (module
    docstring); returns what it chose."""
    chosen = plan(exp_dir, num, margin)
    best = chosen.names[0]
    if len(chosen.names) == 1:
        remove_other_averages(exp_dir)
        log.info("one checkpoint to average: final is %s itself (validation loss %.4g)", best,
                 chosen.losses[best])
        outcome = Outcome(best, chosen, {"checked": False, "why": "one checkpoint: nothing averaged"})
        make_model_dir(exp_dir, best, final, info=outcome.info())
        return outcome
    unchecked = None if check else "not asked for (--check-average false)"
    try:
        valid = valid_set(exp_dir) if check else None  # before the averaging: a missing set fails at once
    except NoValidSet as e:
        valid, unchecked = None, str(e)
    out = write_average(exp_dir, chosen.names)
    outcome = Outcome(out.name, chosen, {"checked": False})
    make_model_dir(exp_dir, out.name, final, info=outcome.info())  # the model the check opens
    if valid is None:
        log.warning("final is %s, not checked against %s on the validation set: %s", out.name, best,
                    unchecked)
        outcome.validation["why"] = unchecked
        _record(final, outcome.info())
        return outcome
    losses = _validation_losses(exp_dir, final, valid, out.name, best, device, threads)
    wins = average_wins(losses[out.name], losses[best])
    outcome.validation = {"checked": True, "set": str(valid.data_list), "device": device, "losses": losses,
                          "chosen": out.name if wins else best}
    if wins:
        outcome.validation["why"] = (f"the average's validation loss {losses[out.name]:.4g} is not above the "
                                     f"best checkpoint's {losses[best]:.4g}")
        log.info("final is %s: %s", out.name, outcome.validation["why"])
        _record(final, outcome.info())
        return outcome
    outcome.checkpoint = best
    outcome.validation["why"] = (f"the average's validation loss {losses[out.name]:.4g} is above the best "
                                 f"checkpoint's {losses[best]:.4g}")
    log.warning("final is the best checkpoint %s, not the average %s: %s", best, out.name,
                outcome.validation["why"])
    make_model_dir(exp_dir, best, final, info=outcome.info())
    return outcome


def _validation_losses(exp_dir: Path, final: Path, valid: ValidSet, average_name: str, best: str,
                       device: str, threads: int | None) -> dict[str, float]:
    """{average_name: its loss, best: its loss} on ``valid``, computed the same way in one run, the model
    opened from ``final`` (the average, as decoding will open it)."""
    scorer = ValidationLoss(final, valid, device=device, threads=threads)
    try:
        losses = {average_name: scorer(safe_load(final / "model.pt"), average_name),
                  best: scorer(finish_state_dict(exp_dir, fp32_state_dict(exp_dir, best)), best)}
    finally:
        scorer.close()
    log.info("validation loss on %s: %s", valid.data_list,
             ", ".join(f"{n} {v:.4g}" for n, v in losses.items()))
    return losses
