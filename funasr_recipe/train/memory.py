"""Memory planning before the first step: DeepSpeed's estimate of the model states per GPU (and of the
CPU memory per node) for the ZeRO stage and offload in use, and an out-of-memory probe that runs the
largest batches of this rank's first epoch once, forward and backward, so that a batch that does not fit
fails in seconds, not hours into training.

Reads this rank's batches of epoch 0 (the real sampler and dataset); writes nothing (log lines). The
probe's weights stay as they were: gradients are dropped, no optimizer step is taken.

  plan = model_states(model, ZeroSettings(stage=3, offload_optimizer=True), nproc_per_node=8, nnodes=2)
  result = probe(model, largest_batches(dataloader), forward, device, limit_bytes)
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from funasr_recipe.train.zero import ZeroSettings

log = logging.getLogger(__name__)
GIB = 1024 ** 3


@dataclass(frozen=True)
class ModelStates:
    params: int
    bytes_per_gpu: int   # parameters, gradients and optimizer states on each GPU
    how: str
    cpu_bytes_per_node: int = 0  # DeepSpeed's "per CPU": host memory of one node, offloaded states included


def model_states(model: torch.nn.Module, zero: ZeroSettings, nproc_per_node: int, nnodes: int) -> ModelStates:
    """DeepSpeed's own estimators for the model states of one GPU and of one node's CPU memory, with the
    offload ``zero`` asks for. ZeRO-1 has none of its own: it is ZeRO-2's figure plus the 16-bit gradients
    ZeRO-1 keeps whole on every GPU. ``zero_init`` is off: funasr builds the whole model on every rank
    before DeepSpeed partitions it (its CPU figure counts that)."""
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    params = sum({p.data_ptr(): p.numel() for p in model.parameters() if p.requires_grad}.values())
    gpus = nproc_per_node * nnodes
    offload = zero.offload_optimizer
    if zero.stage == 3:
        largest = max((sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules()),
                      default=0)
        cpu, gpu, _ = estimate_zero3_model_states_mem_needs(params, largest, nproc_per_node, nnodes,
                                                            cpu_offload=offload,
                                                            cpu_offload_params=offload and zero.offload_param,
                                                            zero_init=False)
        return ModelStates(params, gpu, "deepspeed estimate_zero3_model_states_mem_needs", cpu)
    cpu, gpu = estimate_zero2_model_states_mem_needs(params, nproc_per_node, nnodes, cpu_offload=offload)
    if zero.stage <= 1:
        gpu += int(2 * params * (1 - 1 / gpus))
        return ModelStates(params, gpu, "deepspeed estimate_zero2_model_states_mem_needs + unpartitioned "
                                        "16-bit gradients (ZeRO-1)", cpu)
    return ModelStates(params, gpu, "deepspeed estimate_zero2_model_states_mem_needs", cpu)


@dataclass(frozen=True)
class ProbeBatch:
    why: str            # "most padded frames", "longest utterance"
    indices: list[int]
    padded_frames: int
    longest: int


def largest_batches(batches: Iterable[list[int]], source_len: Callable[[int], int]) -> list[ProbeBatch]:
    """The batch with the most padded frames (batch size x longest) and the one holding the longest
    utterance (the same batch counts once)."""
    by_padded = by_longest = None
    for indices in batches:
        lengths = [int(source_len(i)) for i in indices]
        if not lengths:
            continue
        b = ProbeBatch("", list(indices), len(lengths) * max(lengths), max(lengths))
        if by_padded is None or b.padded_frames > by_padded.padded_frames:
            by_padded = b
        if by_longest is None or b.longest > by_longest.longest:
            by_longest = b
    out = []
    if by_padded is not None:
        out.append(ProbeBatch("most padded frames", by_padded.indices, by_padded.padded_frames,
                              by_padded.longest))
    if by_longest is not None and by_longest.indices != by_padded.indices:
        out.append(ProbeBatch("longest utterance", by_longest.indices, by_longest.padded_frames,
                              by_longest.longest))
    return out


class _PeakMemory:
    """Peak memory since ``reset()``: CUDA's allocator peak, or the process's peak RSS (VmHWM, reset
    through /proc/self/clear_refs) on CPU."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def reset(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            try:
                Path("/proc/self/clear_refs").write_text("5")
            except OSError:
                log.debug("cannot reset the peak RSS: the probe's peak includes what came before")

    def now(self) -> int:
        if self.device.type == "cuda":
            return torch.cuda.memory_allocated(self.device)
        return _status_bytes("VmRSS:")

    def peak(self) -> int:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            return torch.cuda.max_memory_allocated(self.device)
        return _status_bytes("VmHWM:")


def _status_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1]) * 1024
    return 0


def default_limit(device: torch.device, nproc_per_node: int) -> int:
    """What one process may use: its GPU's memory, or on CPU the host's memory shared by its processes."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return total // max(1, nproc_per_node)


@dataclass(frozen=True)
class ProbeResult:
    batch: ProbeBatch
    base_bytes: int          # in use before the batch (weights, the process itself)
    peak_bytes: int | None   # None: out of memory
    seconds: float


def probe(model: torch.nn.Module, batches: list[ProbeBatch], make_batch: Callable[[list[int]], dict],
          forward: Callable[[dict], torch.Tensor], device: torch.device) -> list[ProbeResult]:
    """Forward and backward of each batch; gradients dropped and buffers restored afterwards, so the
    model is as it was. An out-of-memory error of a batch is its result (peak None), not an
    exception."""
    was_training = model.training
    # Training-mode forwards update BatchNorm's running statistics: put them back afterwards.
    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    model.train()
    meter = _PeakMemory(device)
    out = []
    for b in batches:
        start = time.perf_counter()
        peak: int | None
        base = meter.now()
        meter.reset()
        try:
            loss = forward(make_batch(b.indices))
            loss.backward()
            del loss
            peak = meter.peak()
        except torch.OutOfMemoryError:
            peak = None
        finally:
            model.zero_grad(set_to_none=True)
            if device.type == "cuda":
                torch.cuda.empty_cache()
        out.append(ProbeResult(b, base, peak, time.perf_counter() - start))
    with torch.no_grad():
        for buf, kept in buffers:
            buf.copy_(kept)
    model.train(was_training)
    return out


def advice(batch_size: int, fits: float | None) -> str:
    """What to change when the largest batch does not fit; ``fits``: the fraction of the batch's own
    memory that the limit leaves room for (None: unknown, as after an out-of-memory error)."""
    suggested = max(1, int(batch_size * 0.9 * fits)) if fits else batch_size // 2
    return (f"lower ++dataset_conf.batch_size (now {batch_size}; about {suggested} would fit) and raise the "
            "accumulation to keep the effective batch (gradient_accumulation_steps in the DeepSpeed JSON, "
            "++train_conf.accum_grad with --train-engine ddp); or partition the gradients too with "
            "ZeRO-2 (--ds-config ds_configs/ds_stage2_bf16.json), the weights too with ZeRO-3 "
            "(ds_stage3_bf16.json), or move them to CPU memory (ds_stage3_offload_bf16.json; "
            "docs/zero_stages.md); or --grad-checkpoint true to recompute "
            "the encoder's activations in backward instead of keeping them; or drop the longest "
            "utterances (++dataset_conf.max_token_length)")


def held_tensor_bytes(*roots: object, depth: int = 8) -> dict[str, int]:
    """Bytes of the distinct tensor storages reachable from ``roots`` (through attributes, lists, tuples,
    dicts and sets, a tensor's own attributes too: ZeRO-3 keeps a parameter's partition in
    ``param.ds_tensor``), by device type. For the model states a DeepSpeed engine holds after a step:
    ``held_tensor_bytes(engine.module, engine.optimizer)`` (16-bit weights and gradients, fp32 masters,
    Adam's moments, whatever the stage partitioned or offloaded); views of one flat buffer count once."""
    seen: set[int] = set()
    storages: dict[tuple[str, int], int] = {}
    stack: list[tuple[object, int]] = [(r, 0) for r in roots]
    while stack:
        obj, level = stack.pop()
        if id(obj) in seen or level > depth or isinstance(obj, str | bytes | int | float | type):
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            if obj.device.type != "meta":  # a placeholder (a shape, no memory): what funasr's copies hold
                storage = obj.untyped_storage()
                storages[(obj.device.type, storage.data_ptr())] = storage.nbytes()
            if obj.grad is not None:
                stack.append((obj.grad, level + 1))
        if isinstance(obj, torch.nn.Module):
            stack += [(t, level + 1) for t in (*obj.parameters(), *obj.buffers())]
            continue
        if isinstance(obj, dict):
            children = [*obj.keys(), *obj.values()]
        elif isinstance(obj, list | tuple | set | frozenset):
            children = list(obj)
        else:
            children = list(getattr(obj, "__dict__", {}).values())
        stack += [(c, level + 1) for c in children]
    out: dict[str, int] = {}
    for (device, _), size in storages.items():
        out[device] = out.get(device, 0) + size
    return out
