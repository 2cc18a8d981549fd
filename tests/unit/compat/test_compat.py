"""funasr_recipe/compat/: the installed funasr, DeepSpeed and torch are the pinned surface; a changed one is
named line by line and refused before anything is patched; every patch is declared, every declaration is
patched, and nothing patches funasr or DeepSpeed around compat/patching.py. No training."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

from funasr_recipe.compat import pins
from funasr_recipe.compat.patching import UndeclaredTarget, replace, replaced, wrap_method

ROOT = Path(__file__).resolve().parents[3]
TRAINER = "funasr.train_utils.trainer_ds.Trainer"


def test_installed_packages_are_the_pinned_surface() -> None:
    import importlib.metadata

    for dist, pinned in pins.PINS.items():
        assert importlib.metadata.version(dist).split("+")[0] == pinned, dist
    assert pins.surface_differences() == []


def test_a_changed_surface_is_listed_and_refused_before_anything_is_patched(monkeypatch, tmp_path) -> None:
    import importlib.metadata

    from funasr.train_utils.trainer_ds import Trainer

    from funasr_recipe.compat.finetune import FinetuneOptions
    from funasr_recipe.compat.hooks import HookOptions
    from funasr_recipe.compat.install import SurfaceChanged, install

    save, backward = f"{TRAINER}.save_checkpoint", f"{TRAINER}.backward_step"
    # This session may have patched them already (the originals are kept): forget these two, as a fresh
    # process would not have them.
    kept = {k: v for k, v in pins._originals.items() if k not in (save, backward)}
    monkeypatch.setattr(pins, "_originals", kept)
    monkeypatch.setattr(Trainer, "save_checkpoint", lambda self, epoch, model=None: None)  # an upgrade's
    monkeypatch.delattr(Trainer, "backward_step")
    monkeypatch.setitem(pins.PINS, "deepspeed", "0.18.0")
    expected = [
        f"deepspeed: version changed: 0.18.0 -> {importlib.metadata.version('deepspeed').split('+')[0]}",
        f"{backward}: attribute missing",  # in SURFACE's order
        f"{save}: signature changed: expected {pins.SURFACE[save]} got (self, epoch, model=None)",
    ]
    assert pins.surface_differences() == expected
    before = dict(vars(Trainer))
    opts = HookOptions(metrics_port=0, grad_checkpoint=False, oom_probe=False, memory_limit_gib=None,
                       nproc_per_node=1, nnodes=1)
    with pytest.raises(SurfaceChanged) as refused:
        install(opts, FinetuneOptions((), None, tmp_path), fused=True)
    message = str(refused.value)
    assert all(line in message for line in expected) and "3 place(s)" in message
    assert dict(vars(Trainer)) == before and set(pins._originals) == set(kept)  # nothing was patched


def test_patching_refuses_an_undeclared_target_and_restores_a_block() -> None:
    module = types.ModuleType("funasr.not_pinned")
    module.f = len
    with pytest.raises(UndeclaredTarget, match=r"funasr\.not_pinned\.f is not in the pinned surface"):
        replace(module, "f", abs)
    assert module.f is len

    class Engine:  # stands for a class funasr defines, in a module SURFACE does not know
        def save_checkpoint(self) -> str:
            return "real"

    with pytest.raises(UndeclaredTarget, match=r"Engine\.save_checkpoint is not in the pinned surface"):
        wrap_method(Engine, "save_checkpoint")(lambda original, self: "hook")
    assert Engine().save_checkpoint() == "real"
    # A module's copy of th_accuracy must be the very object it claims to copy.
    module.th_accuracy = len
    with pytest.raises(UndeclaredTarget, match="is not a copy of"):
        replace(module, "th_accuracy", abs, copy_of="funasr.metrics.compute_acc.th_accuracy")
    import torch

    save = torch.save
    with replaced(torch, "save", print) as prior:
        assert torch.save is print and prior is save
    assert torch.save is save and pins.original("torch.save") is save


INSTALL_ALL = """
import json, sys
from pathlib import Path
import torch
from deepspeed.runtime.engine import DeepSpeedEngine
from funasr_recipe.compat import checkpoint_io, cpu, offload, pins
from funasr_recipe.compat.finetune import FinetuneOptions
from funasr_recipe.compat.hooks import HookOptions
from funasr_recipe.compat.install import install

exp = Path(sys.argv[1])
install(HookOptions(metrics_port=0, grad_checkpoint=True, oom_probe=True, memory_limit_gib=None,
                    nproc_per_node=1, nnodes=1, max_bad_steps=10), FinetuneOptions((), None, exp), fused=True)
# The patches that last one call: a step under CPU autocast, a DeepSpeed checkpoint's save, the
# optimizer table under offload.
with cpu.cpu_autocast(torch.bfloat16):
    pass
engine = object.__new__(DeepSpeedEngine)
torch.nn.Module.__init__(engine)
with checkpoint_io._Writer(exp, 0, 0, True, None).patched(engine, True):
    pass
assert "save_checkpoint" not in vars(engine) and torch.save is pins.original("torch.save")
with offload.cpu_optimizer("adamw"):
    pass
print(json.dumps({"patched": sorted(pins.replaced_targets()), "after": pins.surface_differences()}))
"""


def test_every_patch_is_declared_and_every_declaration_patched(tmp_path: Path) -> None:
    """Everything installed (and the block-long patches entered) in a fresh CPU process: the targets
    patched are exactly SURFACE (less what lower layers patch themselves), and the originals kept still
    match the pins afterwards."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(ROOT), "DS_ACCELERATOR": "cpu"}
    res = subprocess.run([sys.executable, "-c", INSTALL_ALL, str(tmp_path)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert set(got["patched"]) == set(pins.SURFACE) - set(pins.BELOW_COMPAT), (
        {"undeclared": set(got["patched"]) - set(pins.SURFACE),
         "never patched": set(pins.SURFACE) - set(pins.BELOW_COMPAT) - set(got["patched"])})
    assert got["after"] == []


def direct_patches(root: Path) -> list[str]:
    """Assignments, ``del`` and ``setattr``/``delattr`` on an attribute of something imported: anywhere
    in compat/ (but patching.py) of any import but ``sys``, elsewhere in the package of funasr's or
    DeepSpeed's. As ``file:line: target``."""
    found = []
    for path in sorted((root / "funasr_recipe").rglob("*.py")):
        rel = path.relative_to(root)
        if rel == Path("funasr_recipe/compat/patching.py"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        watched = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                source = node.module if isinstance(node, ast.ImportFrom) else None
                for alias in node.names:
                    module = source or alias.name
                    if module.split(".")[0] == "sys":
                        continue
                    if rel.parts[1] == "compat" or module.split(".")[0] in ("funasr", "deepspeed"):
                        watched.add((alias.asname or alias.name).split(".")[0])
        for node in ast.walk(tree):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign | ast.Delete):
                targets = list(node.targets)
            elif isinstance(node, ast.AugAssign | ast.AnnAssign):
                targets = [node.target]
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args \
                    and node.func.id in ("setattr", "delattr"):
                targets = [ast.Attribute(value=node.args[0], attr="?")]
            for target in targets:
                base = target
                while isinstance(base, ast.Attribute | ast.Subscript):
                    base = base.value
                if isinstance(target, ast.Attribute) and isinstance(base, ast.Name) and base.id in watched:
                    found.append(f"{rel}:{node.lineno}: {ast.unparse(target)}")
    return found


def test_nothing_patches_funasr_around_patching() -> None:
    """Only the lower-layer files pins.BELOW_COMPAT names patch directly, and each of them still does (an
    entry there is not stale)."""
    files = {f.split(":")[0] for f in direct_patches(ROOT)}
    assert files == set(pins.BELOW_COMPAT.values()), direct_patches(ROOT)


def test_the_check_catches_planted_patches(tmp_path: Path) -> None:
    for folder in ("compat", "train"):
        (tmp_path / "funasr_recipe" / folder).mkdir(parents=True)
    (tmp_path / "funasr_recipe" / "compat" / "x.py").write_text(textwrap.dedent("""
        import torch
        def f():
            torch.save = print
    """))
    (tmp_path / "funasr_recipe" / "train" / "y.py").write_text(textwrap.dedent("""
        import torch
        from funasr.train_utils import trainer_ds
        torch.save = print  # torch outside compat/: not this check's business
        def g():
            setattr(trainer_ds.Trainer, "log", None)
    """))
    assert direct_patches(tmp_path) == ["funasr_recipe/compat/x.py:4: torch.save",
                                        "funasr_recipe/train/y.py:6: trainer_ds.Trainer.?"]
