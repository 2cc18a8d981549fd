"""Stage 2's changes to funasr's trainer, installed once per rank in the one order that works, after the
installed packages are checked against the surface compat/pins.py pins: an upgrade of funasr, DeepSpeed
or torch stops here, every difference listed, before any rank trains; then ``run_trainer`` hands over to
funasr's own ``train_ds.main_hydra``.

Reads what the steps read (the installed packages; compat/hooks.py's, finetune.py's and checkpoint_io.py's
settings); writes nothing itself, and changes funasr's, DeepSpeed's and torch's code in this process.

  install(HookOptions(...), FinetuneOptions(...), fused=True)
  run_trainer(hydra_args)
"""

from __future__ import annotations

import sys

from funasr_recipe.compat import checkpoint_io, cpu, finetune, fused_losses, hooks, offload, preemption
from funasr_recipe.compat.finetune import FinetuneOptions
from funasr_recipe.compat.hooks import HookOptions
from funasr_recipe.compat.pins import PINS, surface_differences
from funasr_recipe.model.trainer import register_recipe_classes
from funasr_recipe.train import lr_schedule


class SurfaceChanged(RuntimeError):
    """The installed funasr, DeepSpeed or torch is not the surface the recipe patches; the message lists
    every difference."""


def check_surface() -> None:
    """SurfaceChanged, listing each difference, unless the installed packages match compat/pins.py."""
    found = surface_differences()
    if found:
        pinned = ", ".join(f"{name} {version}" for name, version in PINS.items())
        raise SurfaceChanged(
            f"funasr_recipe/compat/ patches {pinned}; the installed packages differ in {len(found)} "
            "place(s):\n  " + "\n  ".join(found) + "\nInstall the pinned versions (setup.sh: pip install -r "
            "requirements.txt -c constraints.txt), or port compat/ to the new code and record its surface in "
            "funasr_recipe/compat/pins.py")


def install(hook_options: HookOptions, tuning: FinetuneOptions, fused: bool = True) -> None:
    """Check the surface, then install everything in order (each step once per process)."""
    check_surface()  # first: nothing is patched on a surface that changed
    lr_schedule.register()
    register_recipe_classes()  # the skipped-utterance check builds the config's tokenizer class
    # The CPU patch before the hooks (a no-op with CUDA): its warp_model under DDP does not call the method
    # it replaces, so hooks installed under it were skipped (memory plan, OOM probe, freezing, LoRA).
    cpu.apply()
    if fused:
        fused_losses.apply()  # the same losses in fewer passes over the 25055-wide output layer
    hooks.install(hook_options)  # the divergence guard last within it: its wrappers run outside the others
    finetune.install(tuning)  # after hooks.install: its warp_model hook runs first
    checkpoint_io.install()
    offload.install()  # DeepSpeed's CPU Adam for funasr's optimizer where the JSON offloads it
    # Last: its update wrapper runs outermost, after the divergence guard has decided about the step.
    preemption.install()


def run_trainer(hydra_args: list[str]) -> None:
    """funasr's ``train_ds.main_hydra`` with these arguments, the recipe's classes registered and the CPU
    patch applied (both no-ops after ``install``; the CPU patch is one with CUDA)."""
    register_recipe_classes()
    cpu.apply()
    from funasr.bin.train_ds import main_hydra  # imported here: funasr is slow to import

    sys.argv = [sys.argv[0], *hydra_args]
    main_hydra()
