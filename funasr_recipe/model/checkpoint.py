"""Checkpoints of a training run, loaded safely: their fp32 weights (the averaging of the best is
funasr_recipe/model/averaging.py).

Reads  checkpoints of <exp-dir>: DeepSpeed tag dirs (their fp32 master weights, through DeepSpeed's
       zero_to_fp32, ZeRO-1/2/3 and offloaded alike) or state-dict files (the ddp engine); writes nothing.

Where funasr's own record of a checkpoint (``saved_ckpts``, ``best_step_or_epoch``: its client state)
lies, ``client_state_file``: DeepSpeed writes it into every model-states file of a tag dir, one
``mp_rank_00_model_states.pt`` under ZeRO-1/2 and one ``zero_pp_rank_<r>_mp_rank_00_model_states.pt`` per
rank under ZeRO-3, whose weights are partitioned too.

Unpickling (the recipe's one account of ``torch.load``): a checkpoint is a pickle, and a pickle can run
any code when it is loaded. Every load here, and so in local/average.py, local/make_model_dir.py and
packaging/package.py, is ``weights_only=True``: tensors, plain containers and an allowlist of classes; a
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

  state = fp32_state_dict(Path("exp/tiny_sensevoice"), "model.pt.ep3")
"""

from __future__ import annotations

import contextlib
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from funasr_recipe.core.rejections import BadInputError


class UnsafeCheckpointError(BadInputError):
    """A checkpoint holds something other than tensors, containers and allowed classes: not loaded."""


class CorruptCheckpointError(BadInputError):
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


# DeepSpeed's names of the model-states file of a tag dir that holds rank 0's client state: ZeRO-1/2 (one
# for all ranks), then ZeRO-3 (one per rank, each with the same client state).
MODEL_STATES = ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_model_states.pt")


def client_state_file(checkpoint: Path) -> Path:
    """The file of a checkpoint that holds funasr's client state: a state-dict file itself, or the
    model-states file of a DeepSpeed tag dir (module docstring); FileNotFoundError naming both
    DeepSpeed names when a tag dir has neither."""
    if not checkpoint.is_dir():
        return checkpoint
    for name in MODEL_STATES:
        if (checkpoint / name).is_file():
            return checkpoint / name
    raise FileNotFoundError(f"{checkpoint}: no {' or '.join(MODEL_STATES)}: not a complete DeepSpeed "
                            "checkpoint")


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
