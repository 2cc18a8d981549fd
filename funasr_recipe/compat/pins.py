"""The surface of funasr, DeepSpeed and torch the recipe patches, pinned: the versions it was written against
and, for every attribute it wraps or replaces (compat/patching.py refuses any other), what the installed
original looked like. An upgrade that moves, renames or re-signs one of them is then one readable list
before training (compat/install.py), not a hook that silently never runs or a TypeError hours in.

Reads the installed distributions' versions (importlib.metadata) and, in ``surface_differences``, imports
each target's module; writes nothing. Torch-free and funasr-free at import: patching.py imports it.

  for line in surface_differences(): print(line)   # [] on the pinned versions
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import re
from types import ModuleType

# The versions SURFACE was recorded from (requirements.txt and constraints.txt pin the same).
PINS = {"funasr": "1.4.16", "deepspeed": "0.19.8", "torch": "2.9.1"}

MODULE = "<module>"  # a plain attribute that is a module (divergence.py swaps trainer_ds's ``math``)
# An attribute funasr does not define and the recipe adds: funasr's Trainer sets ``self.device`` per
# instance in __init__, so the CPU patch's class-level property would silently hide one funasr added.
ABSENT = "<absent>"

_TRAINER = "funasr.train_utils.trainer_ds.Trainer"
# dotted path -> str(inspect.signature(original)) as installed at the pins (normalised: ``_normalise``),
# or MODULE / ABSENT. Each entry names who patches it; tests/unit/compat/test_compat.py checks that every
# entry is used and every patch is declared.
SURFACE: dict[str, str] = {
    # compat/hooks.py, compat/divergence.py, compat/finetune.py, compat/cpu.py (warp_model),
    # compat/preemption.py and compat/offload.py (warp_optim_scheduler), compat/preemption.py (update_step,
    # save_checkpoint)
    f"{_TRAINER}.warp_model": "(self, model, **kwargs)",
    f"{_TRAINER}.warp_optim_scheduler": "(self, model, **kwargs)",
    f"{_TRAINER}.train_epoch": "(self, model=None, optim=None, scheduler=None, scaler=None, "
                               "dataloader_train=None, dataloader_val=None, epoch=None, **kwargs)",
    f"{_TRAINER}.forward_step": "(self, model, batch, loss_dict={})",
    f"{_TRAINER}.backward_step": "(self, model, scaler, loss_dict={})",
    f"{_TRAINER}.update_step": "(self, model, optim, scheduler, scaler, loss_dict=None)",
    f"{_TRAINER}.log": "(self, loss_dict: dict = None, tag='train', **kwargs)",
    f"{_TRAINER}.validate_epoch": "(self, model=None, dataloader_val=None, epoch=None, writer=None, "
                                  "**kwargs)",
    # compat/checkpoint_io.py
    f"{_TRAINER}.save_checkpoint": "(self, epoch, step=None, model=None, optim=None, scheduler=None, "
                                   "scaler=None, step_in_epoch=None, **kwargs)",
    f"{_TRAINER}.resume_checkpoint": "(self, model=None, optim=None, scheduler=None, scaler=None)",
    "deepspeed.runtime.engine.DeepSpeedEngine.save_checkpoint":
        "(self, save_dir, tag=None, client_state={}, save_latest=True, exclude_frozen_parameters=False)",
    "torch.save": "(obj: object, f: Union[str, os.PathLike[str], IO[bytes]], pickle_module: Any = "
                  "<module 'pickle'>, pickle_protocol: int = 2, _use_new_zipfile_serialization: bool = True, "
                  "_disable_byteorder_record: bool = False) -> None",
    # compat/cpu.py
    f"{_TRAINER}.device": ABSENT,
    "funasr.train_utils.trainer_ds.maybe_autocast": "(dtype=None, use_deepspeed=False)",
    "torch.nn.functional.layer_norm": "(input: torch.Tensor, normalized_shape: list[int], weight: "
                                      "Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None, "
                                      "eps: float = 1e-05) -> torch.Tensor",
    "torch.cuda.set_device": "(device: 'Device') -> None",
    "torch.cuda.memory_allocated": "(device: 'Device' = None) -> int",
    "torch.cuda.max_memory_allocated": "(device: 'Device' = None) -> int",
    "torch.cuda.memory_reserved": "(device: 'Device' = None) -> int",
    "torch.cuda.max_memory_reserved": "(device: 'Device' = None) -> int",
    # compat/divergence.py
    "funasr.train_utils.trainer_ds.math": MODULE,
    # compat/fused_losses.py (th_accuracy also in every funasr module that imported it by name)
    "funasr.models.ctc.ctc.CTC.forward": "(self, hs_pad, hlens, ys_pad, ys_lens)",
    "funasr.losses.label_smoothing_loss.LabelSmoothingLoss.forward": "(self, x, target)",
    "funasr.metrics.compute_acc.th_accuracy": "(pad_outputs, pad_targets, ignore_label)",
    # train/collectives.py, installed by compat/hooks.py
    "torch.distributed.all_reduce": "(tensor, op=<RedOpType.SUM: 0>, group=None, async_op=False)",
    "torch.distributed.reduce_scatter_tensor": "(output, input, op=<RedOpType.SUM: 0>, group=None, "
                                               "async_op=False)",
    "torch.distributed.all_gather_into_tensor": "(output_tensor, input_tensor, group=None, async_op=False)",
    # compat/offload.py, for the length of warp_optim_scheduler under an offloaded optimizer
    "funasr.optimizers.optim_classes": "<dict>",
    # model/checkpoint.py, for the length of a read (see BELOW_COMPAT)
    "deepspeed.utils.zero_to_fp32.torch": MODULE,
}
# Targets patched in a lower layer, which may not import compat (tests/unit/repo/test_style.py), so not
# through patching.py; pinned here all the same. path -> the file that patches it.
BELOW_COMPAT = {
    # zero_to_fp32's torch.load made weights-only while model dirs are written from DeepSpeed checkpoints
    "deepspeed.utils.zero_to_fp32.torch": "funasr_recipe/model/checkpoint.py",
}

_MISSING = object()
# path -> the installed original, from the first time compat/patching.py replaced it in this process:
# what funasr defined, even after the recipe's own patches (or a test's) replaced it.
_originals: dict[str, object] = {}


def remember_original(path: str, value: object) -> None:
    """Keep ``value`` as ``path``'s original unless one is kept already (patching.py, before it replaces)."""
    _originals.setdefault(path, value)


def replaced_targets() -> set[str]:
    """The targets patched so far in this process."""
    return set(_originals)


def missing() -> object:
    """The value ``remember_original`` gets for an attribute that did not exist."""
    return _MISSING


def resolve(path: str) -> object:
    """The object at a dotted path: the longest importable module prefix, then attributes. ImportError
    when no prefix imports, AttributeError when an attribute is missing."""
    parts = path.split(".")
    for split in range(len(parts) - 1, 0, -1):
        name = ".".join(parts[:split])
        try:
            obj: object = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name is not None and not name.startswith(e.name):
                raise  # the module exists and an import inside it failed: that is the difference
            continue
        for attr in parts[split:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(f"no module of {path} can be imported")


def original(path: str) -> object:
    """``path``'s installed original: the one kept before the recipe replaced it, else the live value
    (``missing()`` where there is none). ImportError where its module cannot be imported."""
    if path in _originals:
        return _originals[path]
    try:
        return resolve(path)
    except AttributeError:
        return _MISSING


def _normalise(text: str) -> str:
    """A signature's text without what differs between machines: module file paths, object addresses."""
    text = re.sub(r"<module '([\w.]+)' from '[^']*'>", r"<module '\1'>", text)
    return re.sub(r" at 0x[0-9a-fA-F]+", "", text)


def describe(value: object) -> str:
    """What SURFACE records for ``value``: MODULE, ABSENT, or its normalised signature."""
    if value is _MISSING:
        return ABSENT
    if isinstance(value, ModuleType):
        return MODULE
    if isinstance(value, property):
        return "<property>"
    try:
        return _normalise(str(inspect.signature(value)))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return f"<{type(value).__name__}>"


def _public(version: str) -> str:
    return version.split("+", 1)[0]  # torch's local label (+cu128, +cpu) is the build, not the API


def surface_differences() -> list[str]:
    """One line per difference between the installed packages and the pins: a version, a target whose
    module is gone, an attribute missing (or one now defined that the recipe adds), a signature."""
    found = []
    for dist, pinned in PINS.items():
        try:
            have = _public(importlib.metadata.version(dist))
        except importlib.metadata.PackageNotFoundError:
            found.append(f"{dist}: not installed (pinned {pinned})")
            continue
        if have != pinned:
            found.append(f"{dist}: version changed: {pinned} -> {have}")
    for path, expected in SURFACE.items():
        try:
            got = describe(original(path))
        except ImportError as e:
            found.append(f"{path}: cannot be imported ({e})")
            continue
        if got == expected:
            continue
        if got == ABSENT:
            found.append(f"{path}: attribute missing")
        elif expected == ABSENT:
            found.append(f"{path}: now defined ({got}); the recipe adds it and would hide it")
        else:
            found.append(f"{path}: signature changed: expected {expected} got {got}")
    return found
