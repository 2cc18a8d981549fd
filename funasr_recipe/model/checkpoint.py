"""Checkpoints of a training run: their fp32 weights, their validation losses, the average of the best.

Reads  <exp-dir>/model.pt (funasr's latest checkpoint: its ``saved_ckpts`` maps each kept checkpoint to
       its validation loss) and checkpoints of <exp-dir>: DeepSpeed tag dirs (their fp32 master weights,
       through DeepSpeed's zero_to_fp32) or state-dict files (the ddp engine);
writes <exp-dir>/model.pt.avg<n> (``average``: a plain fp32 state dict).

Why not funasr's own average: at the end of training funasr averages the bf16 module copies of
DeepSpeed checkpoints (its ``model.pt.avg<n>``, which ``average`` replaces); the optimizer's fp32 masters
are the weights training actually holds, and averaging bf16 copies rounds every weight to 8 bits of
mantissa first.

Unpickling (the recipe's one account of ``torch.load``): a checkpoint is a pickle, and a pickle can run
any code when it is loaded. Every load here, and so in local/average.py, local/make_model_dir.py and
reports/package.py, is ``weights_only=True``: tensors, plain containers and an allowlist of classes; a
file with anything else is refused (``UnsafeCheckpointError``) before any of it runs. DeepSpeed's
zero_to_fp32 (the fp32 masters of a tag dir) calls ``torch.load(..., weights_only=False)`` itself:
weights-only fails on its optimizer shards, which pickle DeepSpeed objects (a bf16 ZeRO-1 shard: a
LossScaler, ZeroStageEnum, fragment_address). ``torch.serialization.add_safe_globals`` (here the scoped
``safe_globals``) with ``deepspeed_safe_globals()`` makes those shards load weights-only (tried on a real
2-rank ZeRO-1 checkpoint; the classes' construction only assigns attributes), so ``fp32_state_dict``
runs zero_to_fp32 with its ``torch.load`` forced to weights_only=True and that allowlist. An allowlist
cannot change a library call that passes weights_only=False explicitly, so one load stays unsafe and is
accepted: the trainer's resume, DeepSpeed's TorchCheckpointEngine.load of <exp>/model.pt (funasr's DDP
resume and its end-of-training average pass no weights_only: torch's default, True, applies). It reads only
what this job's own ranks wrote into its exp dir, in this run or the one it resumes; whoever can write
there can as well replace the weights training continues from, so keep the exp dir writable by its owner
only.

  path, names, losses = average(Path("exp/tiny_sensevoice"), num=5)
"""

from __future__ import annotations

import contextlib
import logging
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)


class UnsafeCheckpointError(ValueError):
    """A checkpoint holds something other than tensors, containers and allowed classes: not loaded."""


class CorruptCheckpointError(ValueError):
    """A checkpoint file that is not a whole torch archive (truncated, overwritten): not loaded."""


def deepspeed_safe_globals() -> list[type]:
    """The classes DeepSpeed pickles into its optimizer shards (fp16/bf16, ZeRO 1-3)."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [LossScaler, DynamicLossScaler, ZeroStageEnum, fragment_address]


def safe_load(path: Path, **kwargs: Any) -> Any:
    """``torch.load(path, weights_only=True)`` on CPU; a refused pickle is an ``UnsafeCheckpointError``
    naming the file and what it wanted to run."""
    try:
        return torch.load(path, map_location="cpu", **kwargs, weights_only=True)
    except pickle.UnpicklingError as e:
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        # torch's message is paragraphs of advice around the one line that names the global.
        why = next((line for line in lines if "GLOBAL" in line), lines[-1] if lines else repr(e))
        why = why.split("WeightsUnpickler error:")[-1].split(" Please use")[0].strip()
        raise UnsafeCheckpointError(f"{path}: refused to load (it is not only weights: {why}); load it "
                                    "only if you know who wrote it") from None
    except (RuntimeError, EOFError) as e:
        # torch's message ("PytorchStreamReader failed reading zip archive ...") names no file.
        raise CorruptCheckpointError(f"{path}: not a readable torch checkpoint (truncated or overwritten?): "
                                     f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None


class _WeightsOnlyTorch:
    """``torch`` as zero_to_fp32 sees it, but with a weights-only ``load``."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)

    @staticmethod
    def load(f: Any, *args: Any, **kwargs: Any) -> Any:
        kwargs.pop("weights_only", None)
        kwargs.pop("map_location", None)  # zero_to_fp32 loads to the CPU, as safe_load does
        return safe_load(f, *args, **kwargs)


@contextlib.contextmanager
def _weights_only_zero_to_fp32() -> Iterator[Any]:
    """DeepSpeed's zero_to_fp32 module, its ``torch.load`` weights-only (that module's alone)."""
    from deepspeed.utils import zero_to_fp32

    real = zero_to_fp32.torch
    zero_to_fp32.torch = _WeightsOnlyTorch()
    try:
        with torch.serialization.safe_globals(deepspeed_safe_globals()):
            yield zero_to_fp32
    finally:
        zero_to_fp32.torch = real


def fp32_state_dict(exp_dir: Path, checkpoint: str) -> dict[str, torch.Tensor]:
    """fp32 weights of a checkpoint: a DeepSpeed tag dir's master weights, or a state-dict file's."""
    path = exp_dir / checkpoint
    if path.is_dir():
        # The fp32 master copy lives in the ZeRO optimizer shards; the module copy is bf16.
        with _weights_only_zero_to_fp32() as zero_to_fp32:
            state = zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(str(exp_dir), tag=checkpoint)
    elif path.is_file():
        state = safe_load(path)
        state = state.get("state_dict", state)
    else:
        raise FileNotFoundError(f"no checkpoint {path}")
    return {k: v.float() if v.is_floating_point() else v for k, v in state.items()}


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
    (BatchNorm's num_batches_tracked) are taken from the first, the best. Each checkpoint of a run with
    LoRA adapters is merged first: the mean of B A over checkpoints is not mean(B) mean(A)."""
    from funasr_recipe.model.adapters import finish_state_dict  # it imports this module

    total: dict[str, torch.Tensor] = {}
    for i, name in enumerate(names):
        state = finish_state_dict(exp_dir, fp32_state_dict(exp_dir, name))
        if i == 0:
            total = {k: v.double() if v.is_floating_point() else v.clone() for k, v in state.items()}
            continue
        if state.keys() != total.keys():
            raise ValueError(f"{exp_dir / name} has other parameters than {exp_dir / names[0]}")
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
