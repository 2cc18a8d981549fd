"""Make funasr 1.4.16's trainer run on CPU; nothing changes where CUDA is available.

``funasr/bin/train_ds.py`` and ``funasr/train_utils/trainer_ds.py`` assume CUDA in four places.
Each patch below names the behaviour it replaces; ``apply()`` installs them only when
``torch.cuda.is_available()`` is false, and tests/unit/compat/test_funasr_cpu_patch.py has a test for each;
every target is declared in compat/pins.py and replaced through compat/patching.py.

1. device: the trainer's device becomes ``int(LOCAL_RANK)`` whatever ``++device`` says, so batches
   go ``.to(0)`` (CUDA). On CPU an integer device now means "cpu".
2. autocast: ``maybe_autocast`` always uses ``torch.amp.autocast("cuda", ...)``, silently off on CPU,
   so DeepSpeed's bf16 weights meet fp32 inputs. On CPU it autocasts on "cpu" instead, with
   ``layer_norm`` kept in fp32 as CUDA autocast keeps it (CPU autocast runs it in bf16, which breaks
   Paraformer's loss).
3. DDP: ``warp_model`` calls ``model.cuda(local_rank)`` and ``DDP(device_ids=[local_rank])``, and
   ``train_ds.main`` calls ``torch.cuda.set_device``. On CPU the model stays put and DDP gets no
   device ids; ``set_device`` is a no-op.
4. memory log: ``Trainer.log`` formats ``torch.cuda.memory_*``; on CPU these report 0 instead of
   touching the CUDA runtime (which fails in a CPU-only torch build).
5. denormals: as weights and gradients shrink, CPU kernels meet denormal floats and slow down by an
   order of magnitude (a Conformer's convolution backward went from 2.3 s to 10.7 s a step within a
   dozen steps; GPUs flush them in hardware). On CPU they are flushed to zero.
6. bf16 products without bf16 instructions: on a CPU with neither AVX512-BF16 nor AMX (an AVX2-only
   AMD EPYC, say), torch 2.9 multiplies bf16 matrices in a scalar fallback, 40-60x slower than fp32,
   so a step of the tiny demo model took 14 times as long as on a CPU that has them. There, the
   autocast of 2 gets its own kernels for the products (linear, matmul, mm, bmm, conv1d, ...): the
   operands rounded to bf16 as autocast rounds them, multiplied in fp32, the result rounded to bf16.
   That is what a bf16 kernel computes (a product of two bf16 values is exact in fp32, and bf16
   kernels accumulate in fp32), up to the order of the sums. fp16 likewise, without AMX-FP16. They
   are registered at the AutocastCPU dispatch key, below which autograd records the fp32 product, so
   the backward pass and torch.utils.checkpoint's recomputation (which re-enters autocast) take the
   same path; a TorchFunctionMode, tried first, is bypassed by that recomputation.

The process-group backend (funasr defaults to nccl) is not patched: model/trainer.py passes
``++backend=gloo`` on CPU, a setting funasr already has. Reads and writes nothing.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import torch
import torch.nn.functional as F

from funasr_recipe.compat import fp32_products
from funasr_recipe.compat.patching import replace, wrap_method

log = logging.getLogger(__name__)
_applied = False
_ORIGINAL_LAYER_NORM = F.layer_norm


def _device_property() -> property:
    def get(self: object) -> object:
        device = self.__dict__.get("_recipe_device", "cpu")
        return "cpu" if isinstance(device, int) else device

    def set_(self: object, value: object) -> None:
        self.__dict__["_recipe_device"] = value

    return property(get, set_)


@contextlib.contextmanager
def _fp32_layer_norm() -> Iterator[None]:
    """Within the block, F.layer_norm computes in fp32 and returns fp32, as under CUDA autocast."""
    def layer_norm(x: torch.Tensor, shape, weight=None, bias=None, eps: float = 1e-5) -> torch.Tensor:
        with torch.autocast("cpu", enabled=False):
            return _ORIGINAL_LAYER_NORM(x.float(), shape, None if weight is None else weight.float(),
                                        None if bias is None else bias.float(), eps)

    replace(F, "layer_norm", layer_norm)
    try:
        yield
    finally:
        replace(F, "layer_norm", _ORIGINAL_LAYER_NORM)


@contextlib.contextmanager
def cpu_autocast(dtype: torch.dtype | None = None, use_deepspeed: bool = False) -> Iterator[None]:
    """``trainer_ds.maybe_autocast`` for CPU: autocast to bf16/fp16 when the trainer's dtype says so, its
    products in fp32 where the CPU has no instructions for the dtype (patch 6)."""
    if dtype in (torch.bfloat16, torch.float16):
        if not fp32_products.has_native(dtype):
            fp32_products.install()
        with torch.autocast("cpu", dtype=dtype, cache_enabled=not use_deepspeed), _fp32_layer_norm():
            yield
    else:
        yield


def _warp_model_cpu(original, self, model: torch.nn.Module, **kwargs) -> torch.nn.Module:
    if self.use_ddp and not self.use_deepspeed:
        find_unused = kwargs.get("train_conf", {}).get("find_unused_parameters", False)
        return torch.nn.parallel.DistributedDataParallel(model, find_unused_parameters=find_unused)
    return original(self, model, **{**kwargs, "device": "cpu"})


def apply() -> bool:
    """Install the patches if there is no CUDA; returns whether it did. Idempotent."""
    global _applied
    if torch.cuda.is_available():
        return False
    if _applied:
        return True
    from funasr.train_utils import trainer_ds

    replace(trainer_ds.Trainer, "device", _device_property())
    replace(trainer_ds, "maybe_autocast", cpu_autocast)
    wrap_method(trainer_ds.Trainer, "warp_model")(_warp_model_cpu)
    replace(torch.cuda, "set_device", lambda device: None)
    torch.set_flush_denormal(True)
    for name in ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved"):
        replace(torch.cuda, name, lambda device=None: 0)
    _applied = True
    log.info("no CUDA: funasr trainer patched for CPU (device, autocast, DDP, memory log, denormals)")
    return True
