"""Freezing and LoRA adapters in funasr's trainer: a hook on ``Trainer.warp_model``, where the model is
built and its pretrained weights are loaded, but not yet wrapped by DeepSpeed or DDP.

In the hook, before the original runs:
- every freeze prefix (``--freeze``, and funasr's own ``freeze_param``, which funasr applies just before,
  silently freezing nothing for a prefix that names no parameter) must match a parameter: a
  ValueError otherwise; the prefixes are frozen here too, so they hold whoever set them;
- LoRA adapters are injected (funasr_recipe/model/adapters.py): only they train afterwards. funasr
  resumes <exp>/model.pt after warp_model, so a resumed run's model has the checkpoint's keys;
- global rank 0 writes <exp>/adapter.json and <exp>/frozen_fp32.pt (fp32 copies of every parameter that
  does not train, taken before DeepSpeed casts the module to bf16), which make_model_dir applies to
  every model dir it writes from the run (adapters.finish_state_dict);
- one log line: ``training N of M parameters (x%): LoRA rank r on k layers; frozen: prefixes``.
A run without either option leaves the trainer alone, except that it refuses to resume an exp dir that
was trained with them and removes their stale records from a fresh one.

Reads  <exp>/adapter.json, <exp>/frozen_fp32.pt and whether <exp>/model.pt exists (a resume);
writes <exp>/adapter.json and <exp>/frozen_fp32.pt (rank 0, atomically).

  install(FinetuneOptions(freeze=("encoder",), lora=None, exp_dir=Path("exp/x")))
"""

from __future__ import annotations

import functools
import io
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from funasr_recipe.compat.patching import wrap_method
from funasr_recipe.core.files import write_atomic
from funasr_recipe.core.rejections import BadInputError
from funasr_recipe.model import adapters
from funasr_recipe.model.adapters import LoraSpec
from funasr_recipe.model.checkpoint import safe_load

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FinetuneOptions:
    freeze: tuple[str, ...]  # module prefixes that do not train
    lora: LoraSpec | None    # None: no adapters
    exp_dir: Path

    @classmethod
    def from_cli(cls, exp_dir: Path, freeze: str, adapter: str, lora_rank: int,
                 lora_targets: str) -> FinetuneOptions:
        """From local/train.py's options: ``--freeze a,b --adapter none|lora --lora-rank 8
        --lora-targets x,y`` (alpha is twice the rank)."""
        if adapter not in ("none", "lora"):
            raise BadInputError(f"--adapter {adapter}: choose none or lora")
        spec = (LoraSpec.with_defaults(lora_rank, split_list(lora_targets)) if adapter == "lora" else None)
        return cls(split_list(freeze), spec, Path(exp_dir))


def split_list(value: object) -> tuple[str, ...]:
    """``"a, b"`` -> ("a", "b"); funasr's freeze_param is such a string, or a list from YAML."""
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else list(value)  # a ListConfig too
    return tuple(dict.fromkeys(s.strip() for s in map(str, items) if s.strip()))


def _frozen_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: p.detach().float().clone() for k, p in model.named_parameters()
            if not p.requires_grad and p.is_floating_point()}


def _resuming(trainer, exp_dir: Path) -> bool:
    """funasr's resume_checkpoint will load <exp>/model.pt (a DeepSpeed dir or a state-dict file)."""
    return bool(getattr(trainer, "resume", True)) and (exp_dir / "model.pt").exists()


def _check_records(exp_dir: Path, lora: LoraSpec | None, frozen: tuple[str, ...],
                   names: list[str], resuming: bool) -> bool:
    """Whether the records on disk are this run's already (a resume); a resume with other settings than
    the checkpoint's is a ValueError (its weights would not fit, or frozen copies would be wrong)."""
    info = adapters.read_adapter_json(exp_dir)
    frozen_file = exp_dir / adapters.FROZEN_FILE
    same = (info is not None and info.lora == lora and info.frozen == frozen and frozen_file.is_file()
            and sorted(safe_load(frozen_file, mmap=True)) == sorted(names))
    if resuming and not same and (info is not None or lora is not None or frozen):
        had = "none" if info is None else f"LoRA {info.lora}, frozen {list(info.frozen)}"
        raise BadInputError(f"{exp_dir} resumes from model.pt, trained with other adapter/freezing settings "
                            f"(recorded: {had}; now: LoRA {lora}, frozen {list(frozen)}): give the "
                            "same options or a new --exp-dir")
    return same


def prepare(model: torch.nn.Module, opts: FinetuneOptions, funasr_freeze: object, rank: int,
            resuming: bool) -> str | None:
    """Freeze, inject, check, record (rank 0); returns the log line, or None when there is nothing to do."""
    prefixes = tuple(dict.fromkeys((*split_list(funasr_freeze), *opts.freeze)))
    exp = Path(opts.exp_dir)
    if not prefixes and opts.lora is None:
        if resuming:
            _check_records(exp, None, (), [], resuming)
        elif rank == 0 and (exp / adapters.ADAPTER_FILE).exists():
            log.info("%s: removing the adapter records of an earlier run (this one has none)", exp)
            for name in (adapters.ADAPTER_FILE, adapters.FROZEN_FILE):
                (exp / name).unlink(missing_ok=True)
        return None
    adapters.freeze_check(model, prefixes)  # fatal before anything changes
    to_freeze = set(adapters.frozen_names(model, prefixes))
    for name, param in model.named_parameters():
        if name in to_freeze:
            param.requires_grad = False
    layers = adapters.inject_lora(model, opts.lora) if opts.lora is not None else []
    trainable, total = adapters.freeze_check(model, prefixes)
    if trainable == 0:
        raise BadInputError(f"nothing left to train: every parameter is under {', '.join(prefixes)}")
    frozen = _frozen_state(model)
    if not _check_records(exp, opts.lora, prefixes, sorted(frozen), resuming) and rank == 0:
        # adapter.json last (and an older one removed first): its presence says the frozen copies match.
        exp.mkdir(parents=True, exist_ok=True)
        (exp / adapters.ADAPTER_FILE).unlink(missing_ok=True)
        buffer = io.BytesIO()
        torch.save(frozen, buffer)
        write_atomic(exp / adapters.FROZEN_FILE, buffer.getvalue())
        adapters.write_adapter_json(exp, opts.lora, prefixes)
    parts = []
    if opts.lora is not None:
        parts.append(f"LoRA rank {opts.lora.rank} (alpha {opts.lora.alpha:g}) on {len(layers)} layers")
    if prefixes:
        parts.append(f"frozen: {', '.join(prefixes)}")
    return (f"training {trainable:,} of {total:,} parameters ({100 * trainable / max(1, total):.2f}%): "
            + "; ".join(parts))


_installed = False


def install(opts: FinetuneOptions) -> None:
    """Wrap ``Trainer.warp_model`` (once per process). Install after the recipe's other hooks
    (compat/hooks.py), so that this one runs first: the memory plan and the OOM probe then see the
    model that trains."""
    global _installed
    if _installed:
        return
    _installed = True
    from funasr.train_utils.trainer_ds import Trainer

    wrap = functools.partial(wrap_method, Trainer)

    @wrap("warp_model")
    def _(original, self, model, **kwargs):
        rank = int(getattr(self, "rank", os.environ.get("RANK", 0)))
        line = prepare(model, opts, kwargs.get("freeze_param"), rank, _resuming(self, Path(opts.exp_dir)))
        if line is not None and rank == 0:
            log.info("%s", line)
        return original(self, model, **kwargs)
