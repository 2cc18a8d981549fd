"""CPU autocast kernels that multiply bf16/fp16 operands in fp32 where the CPU has no instructions for them.

Patch 6 of compat/cpu.py (the why is there). ``install()`` replaces, at the AutocastCPU dispatch key, the
kernels of the products autocast runs in low precision; every other op, and every op outside autocast, is
untouched. The kernels keep autocast's contract (operands rounded to its dtype, result in its dtype) and
differ from a native low-precision kernel only in the order of the fp32 sums. Reads and writes nothing.
"""

from __future__ import annotations

import functools
import logging
import threading
import warnings
from collections.abc import Callable

import torch

log = logging.getLogger(__name__)

# The overloads CPU autocast registers in its lower_precision_fp list (aten/src/ATen/autocast_mode.cpp)
# whose bf16 CPU kernels fall back to scalar code without AVX512-BF16/AMX; attention (sdpa) and the
# elementwise ops are fast enough in bf16 and keep autocast's own kernels.
_OVERLOADS = ("linear", "matmul", "mm", "addmm", "bmm", "baddbmm", "addbmm", "conv1d", "conv1d.padding",
              "conv2d", "conv2d.padding", "conv_transpose1d", "conv_transpose2d.input")
_NO_AUTOCAST = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)
_lock = threading.Lock()
_library: torch.library.Library | None = None


@functools.cache
def has_native(dtype: torch.dtype) -> bool:
    """Whether this CPU multiplies ``dtype`` matrices with instructions of its own."""
    cpu = torch._C._cpu
    if dtype == torch.bfloat16:
        return cpu._is_avx512_bf16_supported() or cpu._is_amx_tile_supported()
    return cpu._is_amx_fp16_supported()


def _cast(x: object, dtype: torch.dtype, up: bool) -> object:
    """Autocast's cast of an operand (floating, not float64) to ``dtype``, then to fp32 when ``up``."""
    if isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != torch.float64:
        x = x.to(dtype)
        return x.float() if up else x
    if isinstance(x, list | tuple):
        return type(x)(_cast(v, dtype, up) for v in x)
    return x


def _kernel(op: torch._ops.OpOverload) -> Callable[..., torch.Tensor]:
    def kernel(*args: object, **kwargs: object) -> torch.Tensor:
        dtype = torch.get_autocast_dtype("cpu")
        up = not has_native(dtype)
        # Below this key autograd records the cast and the product, so backward and recomputation agree.
        with torch._C._ExcludeDispatchKeyGuard(_NO_AUTOCAST):
            out = op(*_cast(args, dtype, up), **{k: _cast(v, dtype, up) for k, v in kwargs.items()})
            return out.to(dtype) if up else out

    return kernel


def install() -> bool:
    """Register the kernels for this process (once); returns whether this call registered them."""
    global _library
    with _lock:
        if _library is not None:
            return False
        library = torch.library.Library("aten", "IMPL")
        with warnings.catch_warnings():  # "Overriding a previously registered kernel": that is the point
            warnings.simplefilter("ignore", UserWarning)
            for name in _OVERLOADS:
                packet, _, overload = name.partition(".")
                op = getattr(getattr(torch.ops.aten, packet), overload or "default")
                library.impl(name, _kernel(op), "AutocastCPU")
        _library = library
    log.info("this CPU has no bf16/fp16 matrix instructions: autocast's products are computed in fp32 from "
             "operands rounded to its dtype (the same values up to the order of the sums; torch's own "
             "fallback is 40-60x slower)")
    return True


def uninstall() -> None:
    """Give autocast its own kernels back (tests use it to compare the two)."""
    global _library
    with _lock:
        if _library is not None:
            _library._destroy()
            _library = None
