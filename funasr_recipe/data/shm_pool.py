"""Shared-memory buffers that DataLoader workers fill with batches and reuse once the trainer drops them.

Reads and writes only memory: one anonymous shared mapping per dataset, made in the training process
before DataLoader workers fork (so every worker maps the same pages), split into one region per
worker plus one for the training process itself, each of a few fixed-size slots.

Why: a batch in fresh memory costs a page fault per 4 KiB, twice in a worker (filling new shared
memory, then mapping it in the training process): measured here, more than the features themselves
take to build. A slot is written once per batch into pages that stay mapped in both processes.

Safety: a slot is reused only after the training process has released the batch built in it. Each
slot has two counters in shared memory: ``issued`` (written only by the region's own process, when it
fills the slot) and ``released`` (written only where the batch is consumed, by a finalizer of the array
that the batch's tensor views, i.e. when the tensor, every view of it and every array made from it are
gone). A slot is free when the two are equal. A release carries its batch's generation, so a late one
(from an older batch of the slot) can only make the slot look busy, never free. No free slot (the
trainer keeps batches, or one never arrived because a loader stopped mid-epoch), a batch larger than a
slot, or a worker started by ``spawn`` (no inherited mapping): the caller gets None and allocates as
torch does. The mapping is anonymous, so a small /dev/shm (Docker's 64 MiB) does not limit it.

  pool = SlotPool.create(regions=num_workers + 1, slots=prefetch_factor + 2, slot_bytes=...)
  speech = pool.tensor((8, 700, 560), torch.float32)  # or None
  state = pool.reduce(speech)  # in a worker: what to pickle instead of the tensor (None: not pooled)
  speech = rebuild(state)      # in the training process
"""

from __future__ import annotations

import logging
import mmap
import secrets
import weakref
from collections.abc import Sequence

import numpy as np
import torch

log = logging.getLogger(__name__)
_POOLS: weakref.WeakValueDictionary[str, SlotPool] = weakref.WeakValueDictionary()
_PAGE = mmap.PAGESIZE


class SlotPool:
    """``regions`` x ``slots`` buffers of ``slot_bytes`` each in one shared mapping (see the module doc)."""

    def __init__(self, regions: int, slots: int, slot_bytes: int) -> None:
        self.regions, self.slots = int(regions), int(slots)
        self.slot_bytes = -(-int(slot_bytes) // _PAGE) * _PAGE
        count = self.regions * self.slots
        self._data = mmap.mmap(-1, count * self.slot_bytes, flags=mmap.MAP_SHARED)
        self._counters = mmap.mmap(-1, 2 * 4 * count, flags=mmap.MAP_SHARED)
        counters = np.frombuffer(self._counters, dtype=np.uint32).reshape(2, count)
        self._issued, self._released = counters[0], counters[1]
        self._next = [0] * self.regions
        self._base = np.frombuffer(self._data, dtype=np.uint8, count=1).ctypes.data
        self.key = secrets.token_hex(8)
        _POOLS[self.key] = self

    @classmethod
    def create(cls, regions: int, slots: int, slot_bytes: int) -> SlotPool | None:
        """A pool, or None (and a log line) where the system will not map that much shared memory."""
        try:
            return cls(regions, slots, slot_bytes)
        except (OSError, ValueError, OverflowError) as e:
            log.warning("no shared batch buffers (%d x %d x %d bytes): %s; batches use fresh shared memory",
                        regions, slots, slot_bytes, e)
            return None

    def __getstate__(self) -> dict:
        # A spawned worker cannot map the creator's anonymous memory: it gets no pool.
        return {"dead": True}

    def __setstate__(self, state: dict) -> None:
        self._data = None

    def _region(self) -> int | None:
        info = torch.utils.data.get_worker_info()
        region = self.regions - 1 if info is None else info.id
        return region if region < self.regions - 1 or info is None else None

    def tensor(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor | None:
        """An uninitialised tensor in a free slot of this process's region, or None (no free slot, too
        big, no pool in this process)."""
        nbytes = int(np.prod(shape)) * torch.empty(0, dtype=dtype).element_size()
        region = self._region() if self._data is not None else None
        if region is None or nbytes > self.slot_bytes:
            return None
        for step in range(self.slots):
            slot = region * self.slots + (self._next[region] + step) % self.slots
            if self._issued[slot] == self._released[slot]:
                self._next[region] = (slot - region * self.slots + 1) % self.slots
                self._issued[slot] += 1
                # In a worker the slot is released where the batch is consumed, not when the worker
                # drops its own tensor after pickling.
                consumer = torch.utils.data.get_worker_info() is None
                return _view(self, slot, int(self._issued[slot]) if consumer else None, dtype, tuple(shape))
        return None

    def reduce(self, tensor: torch.Tensor) -> tuple | None:
        """What to pickle for a tensor over one of this pool's slots (any view of it), for ``rebuild``:
        the slot, its generation and the view's geometry, not the bytes. None for other tensors."""
        if self._data is None:
            return None
        slot = self._slot_of(tensor)
        if slot is None:
            return None
        return (self.key, slot, int(self._issued[slot]), str(tensor.dtype).removeprefix("torch."),
                tuple(tensor.shape), tuple(tensor.stride()), tensor.storage_offset())

    def give_back(self, tensor: torch.Tensor) -> None:
        """Free the slot of a tensor that this process made and will never hand out (its batch failed)."""
        slot = self._slot_of(tensor) if self._data is not None else None
        if slot is not None:
            self._released[slot] = self._issued[slot]

    def _slot_of(self, tensor: torch.Tensor) -> int | None:
        offset = tensor.untyped_storage().data_ptr() - self._base
        if not 0 <= offset < self.regions * self.slots * self.slot_bytes:
            return None
        slot, within = divmod(offset, self.slot_bytes)
        return slot if within == 0 else None


def _view(pool: SlotPool, slot: int, generation: int | None, dtype: torch.dtype,
          shape: tuple) -> torch.Tensor:
    """A tensor over ``slot``; with a ``generation``, the last reference to its memory frees the slot."""
    array = np.frombuffer(pool._data, dtype=np.uint8, count=pool.slot_bytes, offset=slot * pool.slot_bytes)
    array = array.view(torch.empty(0, dtype=dtype).numpy().dtype)
    if generation is not None:
        # Not at exit: a forked worker holds copies of the trainer's batches and must not release them.
        weakref.finalize(array, _release, pool._released, slot, generation).atexit = False
    numel = int(np.prod(shape))
    return torch.from_numpy(array)[:numel].view(shape)


def _release(released: np.ndarray, slot: int, generation: int) -> None:
    released[slot] = generation


def _rebuild(key: str, slot: int, generation: int, dtype: str, shape: tuple, stride: tuple,
             offset: int) -> torch.Tensor:
    pool = _POOLS.get(key)
    if pool is None or pool._data is None:
        raise RuntimeError("a DataLoader worker sent a batch in shared buffers that this process does not "
                           "have (the dataset was not created here before the workers started)")
    base = _view(pool, slot, generation, getattr(torch, dtype), (pool.slot_bytes // _itemsize(dtype),))
    return base.as_strided(shape, stride, offset)


def _itemsize(dtype: str) -> int:
    return torch.empty(0, dtype=getattr(torch, dtype)).element_size()


def rebuild(args: tuple) -> torch.Tensor:
    """The tensor that ``SlotPool.reduce`` described, in the process that unpickles it."""
    return _rebuild(*args)
