"""Average the n best checkpoints of a training run by validation loss, in fp32.

Reads  <exp-dir>/model.pt (funasr's latest checkpoint: its ``saved_ckpts`` maps each kept checkpoint
       to its validation loss) and the n checkpoints with the lowest loss: DeepSpeed tag dirs (their
       fp32 master weights, through DeepSpeed's zero_to_fp32) or state-dict files (the ddp engine);
writes <exp-dir>/model.pt.avg<n> (a plain fp32 state dict) and <exp-dir>/final/, the average as a
       model dir in the hub's format (local/make_model_dir.py), which decoding and export read.

Why not funasr's own average: at the end of training funasr averages the bf16 module copies of
DeepSpeed checkpoints (its ``model.pt.avg<n>``, which this file replaces); the optimizer's fp32 masters
are the weights training actually holds, and averaging bf16 copies rounds every weight to 8 bits of
mantissa first.

  python -m local.average --exp-dir exp/tiny_sensevoice --num 5
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import torch

from local.log_utils import setup_logging
from local.make_model_dir import fp32_state_dict, make_model_dir

log = logging.getLogger(__name__)


def validation_losses(exp_dir: Path) -> dict[str, float]:
    """Checkpoint name -> validation loss, as funasr's trainer recorded them in its latest checkpoint."""
    latest = exp_dir / "model.pt"
    state_file = latest / "mp_rank_00_model_states.pt" if latest.is_dir() else latest
    if not state_file.is_file():
        raise FileNotFoundError(f"{state_file}: no latest checkpoint; has stage 2 finished an epoch?")
    state = torch.load(state_file, map_location="cpu", weights_only=False)
    losses = state.get("saved_ckpts") or state.get("val_loss_step_or_epoch") or {}
    if state.get("avg_keep_nbest_models_type", "loss") != "loss":
        # With "acc", saved_ckpts holds accuracies: the lowest would be the worst.
        raise ValueError(f"{state_file}: checkpoints were kept by {state['avg_keep_nbest_models_type']}; "
                         "set train_conf.avg_keep_nbest_models_type=loss (DESIGN.md says why)")
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
    (BatchNorm's num_batches_tracked) are taken from the first, the best."""
    total: dict[str, torch.Tensor] = {}
    for i, name in enumerate(names):
        state = fp32_state_dict(exp_dir, name)
        if i == 0:
            total = {k: v.double() if v.is_floating_point() else v.clone() for k, v in state.items()}
            continue
        if state.keys() != total.keys():
            raise ValueError(f"{exp_dir / name} has other parameters than {exp_dir / names[0]}")
        for k, v in state.items():
            if v.is_floating_point():
                total[k] += v.double()
    return {k: (v / len(names)).float() if v.is_floating_point() else v for k, v in total.items()}


def average(exp_dir: Path, num: int, final_dir: Path) -> Path:
    """Write model.pt.avg<k> (k = how many were averaged) and ``final_dir``; returns the state-dict path."""
    losses = validation_losses(exp_dir)
    names = select_best(losses, num, exp_dir)
    if len(names) < num:
        log.warning("only %d checkpoints to average (asked for %d)", len(names), num)
    log.info("averaging %s (validation loss %s)", ", ".join(names),
             ", ".join(f"{losses[n]:.3f}" for n in names))
    out = exp_dir / f"model.pt.avg{len(names)}"
    torch.save(average_fp32(exp_dir, names), out)
    make_model_dir(exp_dir, out.name, final_dir,
                   info={"averaged": {name: losses[name] for name in names}})
    log.info("%s and %s written", out, final_dir)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--exp-dir", type=Path, required=True)
    parser.add_argument("--num", type=int, help="checkpoints to average (default: the config's "
                        "train_conf.avg_nbest_model in <exp-dir>/config.yaml, else 5)")
    parser.add_argument("--final-dir", type=Path, help="default: <exp-dir>/final")
    args = parser.parse_args(argv)
    setup_logging()
    num = args.num
    if num is None:
        from omegaconf import OmegaConf

        train_conf = OmegaConf.load(args.exp_dir / "config.yaml").get("train_conf", {})
        num = int(train_conf.get("avg_nbest_model", 5))
    if num < 1:
        parser.error(f"--num must be positive, got {num}")
    try:
        out = average(args.exp_dir, num, args.final_dir or args.exp_dir / "final")
    except (FileNotFoundError, ValueError) as e:
        log.error("%s", e)
        return 1
    print(json.dumps({"averaged": str(out)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
