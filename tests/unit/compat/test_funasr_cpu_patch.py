"""One test per behaviour funasr_recipe/compat/cpu.py changes in funasr's trainer (CPU only)."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from funasr_recipe.compat import cpu as funasr_cpu_patch

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the patch is a no-op where CUDA exists")


@pytest.fixture(scope="module")
def trainer_ds():
    from funasr.train_utils import trainer_ds

    assert funasr_cpu_patch.apply() is True
    assert funasr_cpu_patch.apply() is True  # idempotent
    return trainer_ds


def bare_trainer(trainer_ds, **attrs):
    trainer = object.__new__(trainer_ds.Trainer)  # no __init__: only the patched members are exercised
    for k, v in attrs.items():
        setattr(trainer, k, v)
    return trainer


def test_integer_device_means_cpu(trainer_ds) -> None:
    """train_ds.main sets trainer.device = int(LOCAL_RANK); batches must stay on the CPU."""
    trainer = bare_trainer(trainer_ds)
    trainer.device = 0
    assert trainer.device == "cpu"
    from funasr.train_utils.device_funcs import to_device

    batch = to_device({"speech": torch.zeros(2, 3)}, trainer.device)
    assert batch["speech"].device.type == "cpu"
    trainer.device = "cpu"
    assert trainer.device == "cpu"


def test_autocast_runs_on_cpu_with_fp32_layer_norm(trainer_ds) -> None:
    """bf16 weights (as DeepSpeed casts them) with fp32 inputs work, and layer_norm stays fp32 as on CUDA."""
    assert trainer_ds.maybe_autocast is funasr_cpu_patch.cpu_autocast
    lin, norm = torch.nn.Linear(4, 4).bfloat16(), torch.nn.LayerNorm(4).bfloat16()
    x = torch.randn(3, 4)
    with pytest.raises(RuntimeError):  # what funasr's CUDA-only autocast left us with on CPU
        lin(x)
    with trainer_ds.maybe_autocast(dtype=torch.bfloat16, use_deepspeed=True):
        y = lin(x)
        z = norm(y)
    assert y.dtype == torch.bfloat16 and z.dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):  # plain CPU autocast: layer_norm in bf16
        assert norm(lin(x)).dtype == torch.bfloat16
    assert F.layer_norm is funasr_cpu_patch._ORIGINAL_LAYER_NORM  # restored on exit
    with trainer_ds.maybe_autocast(dtype=torch.float32):  # fp32 training: no autocast at all
        assert torch.nn.Linear(4, 4)(x).dtype == torch.float32


def test_ddp_wraps_without_cuda(trainer_ds, tmp_path) -> None:
    """warp_model's DDP branch moved the model to CUDA; set_device is a no-op."""
    torch.cuda.set_device(0)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29637")
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        trainer = bare_trainer(trainer_ds, use_ddp=True, use_deepspeed=False)
        model = trainer.warp_model(torch.nn.Linear(2, 2), train_conf={})
        assert isinstance(model, torch.nn.parallel.DistributedDataParallel)
        assert next(model.parameters()).device.type == "cpu"
        model(torch.zeros(1, 2)).sum().backward()
        plain = bare_trainer(trainer_ds, use_ddp=False, use_deepspeed=False).warp_model(
            torch.nn.Linear(2, 2), device=0)
        assert next(plain.parameters()).device.type == "cpu"
    finally:
        torch.distributed.destroy_process_group()


def test_denormals_are_flushed(trainer_ds) -> None:
    tiny = torch.tensor([1e-39], dtype=torch.float32)  # below float32's smallest normal, 1.18e-38
    assert float(tiny * 1.0) == 0.0


def test_memory_figures_of_the_log_line_are_zero(trainer_ds) -> None:
    assert torch.cuda.memory_allocated() == 0 and torch.cuda.max_memory_reserved() == 0
