"""Stage 3's average of a training run's best checkpoints, in fp32.

Reads  <exp-dir>/model.pt (funasr's latest checkpoint: its ``saved_ckpts`` maps each kept checkpoint to
       its validation loss) and the chosen checkpoints' fp32 weights (funasr_recipe/model/checkpoint.py,
       each merged with its LoRA adapters first: funasr_recipe/model/adapters.py);
writes <exp-dir>/model.pt.avg<n> (``average``: a plain fp32 state dict).

Why not funasr's own average: at the end of training funasr averages the bf16 module copies of
DeepSpeed checkpoints (its ``model.pt.avg<n>``, which ``average`` replaces); the optimizer's fp32 masters
are the weights training actually holds, and averaging bf16 copies rounds every weight to 8 bits of
mantissa first.

  path, names, losses = average(Path("exp/tiny_sensevoice"), num=5)
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from funasr_recipe.core.rejections import BadInputError
from funasr_recipe.model.adapters import finish_state_dict
from funasr_recipe.model.checkpoint import fp32_state_dict, safe_load

log = logging.getLogger(__name__)


def validation_losses(exp_dir: Path) -> dict[str, float]:
    """Checkpoint name -> validation loss, as funasr's trainer recorded them in its latest checkpoint."""
    latest = exp_dir / "model.pt"
    state_file = latest / "mp_rank_00_model_states.pt" if latest.is_dir() else latest
    if not state_file.is_file():
        raise FileNotFoundError(f"{state_file}: no latest checkpoint; has stage 2 finished an epoch?")
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
    return sorted(present, key=lambda name: (present[name], name))[:num]


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


def average(exp_dir: Path, num: int) -> tuple[Path, list[str], dict[str, float]]:
    """Write model.pt.avg<k> (k = how many were averaged, at most ``num``); returns its path, the names
    averaged (best first) and every recorded validation loss."""
    losses = validation_losses(exp_dir)
    names = select_best(losses, num, exp_dir)
    if len(names) < num:
        log.warning("only %d checkpoints to average (asked for %d)", len(names), num)
    log.info("averaging %s (validation loss %s)", ", ".join(names),
             ", ".join(f"{losses[n]:.3f}" for n in names))
    out = exp_dir / f"model.pt.avg{len(names)}"
    torch.save(average_fp32(exp_dir, names), out)
    return out, names, losses
