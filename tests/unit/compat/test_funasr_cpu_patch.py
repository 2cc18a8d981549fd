"""One test per behaviour funasr_recipe/compat/cpu.py changes in funasr's trainer (CPU only)."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from funasr_recipe.compat import cpu as funasr_cpu_patch
from funasr_recipe.compat import fp32_products

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


@pytest.fixture
def own_kernels(monkeypatch: pytest.MonkeyPatch):
    """Patch 6 as on a CPU without bf16/fp16 instructions, removed afterwards."""
    fp32_products.uninstall()
    monkeypatch.setattr(fp32_products, "has_native", lambda dtype: False)
    yield
    fp32_products.uninstall()


def reference_product(op, *operands: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """What a bf16 (fp16) kernel computes: operands rounded to dtype, exact products summed in fp32."""
    return op(*(x.to(dtype).float() for x in operands)).to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_products_without_low_precision_instructions_are_fp32_of_rounded_operands(
        trainer_ds, own_kernels, dtype: torch.dtype) -> None:
    """Patch 6: where the CPU lacks the dtype's instructions, linear, matmul and conv1d under the trainer's
    autocast give the fp32 product of the rounded operands in dtype; gradients reach dtype weights."""
    torch.manual_seed(0)
    x, w, b = torch.randn(6, 40), torch.randn(24, 40).to(dtype).requires_grad_(), torch.randn(24).to(dtype)
    a, k = torch.randn(3, 5, 40), torch.randn(8, 5, 3)
    with trainer_ds.maybe_autocast(dtype):
        y = F.linear(x, w, b)
        z = a @ a.transpose(1, 2)
        c = F.conv1d(a.transpose(1, 2)[:, :5], k.to(dtype), padding=1)
    assert y.dtype == z.dtype == c.dtype == dtype
    assert torch.equal(y, reference_product(F.linear, x, w, b, dtype=dtype))
    assert torch.equal(z, reference_product(lambda p, q: p @ q, a, a.transpose(1, 2), dtype=dtype))
    conv = lambda p, q: F.conv1d(p, q, padding=1)  # noqa: E731
    assert torch.equal(c, reference_product(conv, a.transpose(1, 2)[:, :5], k, dtype=dtype))
    y.float().sum().backward()
    assert w.grad is not None and w.grad.dtype == dtype
    torch.testing.assert_close(w.grad.float(), x.to(dtype).float().sum(0).expand(24, 40), atol=0, rtol=1e-2)
    with torch.autocast("cpu", enabled=False):  # outside autocast nothing changes
        assert F.linear(x, w.detach().float()).dtype == torch.float32


def test_own_kernels_agree_with_autocasts_within_rounding(trainer_ds) -> None:
    """Patch 6 differs from the native bf16 kernels only in the order of the fp32 sums."""
    torch.manual_seed(0)
    lin, x = torch.nn.Linear(64, 32), torch.randn(10, 64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        native = lin(x)
    fp32_products.install()
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            ours = lin(x)
    finally:
        fp32_products.uninstall()
    torch.testing.assert_close(ours.float(), native.float(), atol=1e-2, rtol=1e-2)


def test_gradient_checkpointing_recomputes_through_the_same_kernels(trainer_ds, own_kernels) -> None:
    """torch.utils.checkpoint recomputes the block in backward under the saved autocast state; its
    products must take patch 6's path again (a TorchFunctionMode did not: "recomputed metadata")."""
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(),
                                torch.nn.Conv1d(32, 32, 3, padding=1))
    x = torch.randn(4, 16)

    def grads(checkpointed: bool) -> list[torch.Tensor]:
        block.zero_grad()
        with trainer_ds.maybe_autocast(torch.bfloat16):
            f = lambda t: block[2](block[1](block[0](t)).unsqueeze(-1).expand(4, 32, 5))  # noqa: E731
            y = checkpoint(f, x, use_reentrant=False) if checkpointed else f(x)
        y.float().square().sum().backward()
        return [p.grad.clone() for p in block.parameters()]

    for plain, checkpointed in zip(grads(False), grads(True), strict=True):
        assert torch.equal(plain, checkpointed)


def test_a_cpu_with_the_instructions_keeps_autocasts_own_kernels(trainer_ds,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    fp32_products.uninstall()
    monkeypatch.setattr(fp32_products, "has_native", lambda d: True)
    torch.manual_seed(0)
    x, w = torch.randn(2, 4), torch.randn(3, 4)
    with trainer_ds.maybe_autocast(torch.bfloat16):
        y = F.linear(x, w)
    assert fp32_products._library is None and y.dtype == torch.bfloat16
