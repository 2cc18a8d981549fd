"""Time spent in the gradient collectives of each training step, measured where DDP and DeepSpeed call
them: ``torch.distributed.all_reduce``, ``reduce_scatter_tensor`` and ``all_gather_into_tensor``
(deepspeed.comm calls these through the module, so wrapping the module's functions sees its calls).

On CPU (gloo) a synchronous collective returns when it is done: wall time. On CUDA it returns once
queued; CUDA events on the current stream, which waits for NCCL's, give its duration, read (with a
synchronize) only when the step is logged. Asynchronous calls (async_op=True) are counted from the call
to the return only; their wait happens elsewhere.

Reads and writes nothing.

  timer = CollectiveTimer(); timer.install(replace); timer.reset(); ...; seconds = timer.seconds()
  # replace: funasr_recipe.compat.patching's (this layer may not import it: tests/unit/repo/test_style.py)
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

TIMED = ("all_reduce", "reduce_scatter_tensor", "all_gather_into_tensor")


class CollectiveTimer:
    def __init__(self) -> None:
        self._wall = 0.0
        self._events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self._installed = False

    def install(self, replace: Callable[[object, str, object], object]) -> None:
        """Wrap the collectives with ``replace(module, name, new)``: compat/patching.py's, which checks them
        against the pinned surface."""
        if self._installed:
            return
        self._installed = True
        for name in TIMED:
            if hasattr(dist, name):
                replace(dist, name, self._timed(getattr(dist, name)))

    def _timed(self, original):
        @functools.wraps(original)
        def call(*args, **kwargs):
            tensor = args[0] if args else next(iter(kwargs.values()), None)
            on_cuda = isinstance(tensor, torch.Tensor) and tensor.is_cuda
            if on_cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                out = original(*args, **kwargs)
                end.record()
                self._events.append((start, end))
                return out
            t = time.perf_counter()
            out = original(*args, **kwargs)
            self._wall += time.perf_counter() - t
            return out
        return call

    def reset(self) -> None:
        self._wall = 0.0
        self._events.clear()

    def seconds(self) -> float:
        """Seconds in collectives since the last reset."""
        if self._events:
            self._events[-1][1].synchronize()
        return self._wall + sum(s.elapsed_time(e) for s, e in self._events) / 1000.0
