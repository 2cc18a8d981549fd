"""The recipe's hooks on funasr 1.4.16's trainer (``funasr.train_utils.trainer_ds.Trainer``), installed
once per rank before ``train_ds.main_hydra`` runs: funasr has no callback API, so each hook wraps one
Trainer method and calls the original unchanged.

- ``warp_model`` (the model is built, not yet wrapped by DeepSpeed/DDP): activation checkpointing, the
  memory plan, and the out-of-memory probe on this rank's largest batches of epoch 0; after the first
  ``update_step``, what DeepSpeed's states measure on rank 0.
- ``train_epoch``: the schedule learns the run's length (``set_total_steps``), the metrics endpoint starts.
- ``forward_step``/``update_step``/``log``: utterances and frames, data wait, gradient norm, loss and
  learning rate into the metrics; ``validate_epoch``: validation loss, and the schedule's restarts.
- ``torch.distributed`` collectives are timed per step (the gradient sync of DDP and of DeepSpeed).
- the divergence guard (funasr_recipe/compat/divergence.py) wraps these wrappers: a bad step is skipped.

Reads what the trainer reads; writes log lines and the metrics endpoint (funasr_recipe/train/metrics.py).

  install(HookOptions(metrics_port=9400, grad_checkpoint=False, oom_probe=True, memory_limit_gib=None,
                      nproc_per_node=8, nnodes=2, max_bad_steps=10))
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import torch

from funasr_recipe.compat import divergence
from funasr_recipe.compat.patching import replace, wrap_method
from funasr_recipe.train.collectives import CollectiveTimer
from funasr_recipe.train.memory import (
    GIB,
    advice,
    default_limit,
    held_tensor_bytes,
    largest_batches,
    model_states,
    probe,
)
from funasr_recipe.train.metrics import Exporter, StepMeter, alerts, log_line
from funasr_recipe.train.zero import ZeroSettings, read_ds_config

log = logging.getLogger(__name__)
MEMORY_TARGET = 0.85  # the cluster guides' ceiling: above it fragmentation and a longer batch later fail


@dataclass(frozen=True)
class HookOptions:
    metrics_port: int             # 0: no endpoint
    grad_checkpoint: bool
    oom_probe: bool
    memory_limit_gib: float | None  # None: the GPU's memory, or on CPU the host's shared by its processes
    nproc_per_node: int
    nnodes: int
    max_bad_steps: int = 10         # bad steps in a row that stop training (0: never)


class OutOfMemoryPlan(RuntimeError):
    """The largest batch does not fit; the message says which and what to change."""


@dataclass
class _State:
    opts: HookOptions
    meter: StepMeter = field(default_factory=StepMeter)
    timer: CollectiveTimer = field(default_factory=CollectiveTimer)
    exporter: Exporter | None = None
    scheduler: object = None
    frames_per_input: int = 1   # 10 ms frames per model input frame (the LFR stride)
    started: bool = False
    log_interval: int = 1
    alerted: dict[str, float] = field(default_factory=dict)
    measured: bool = False  # the model states DeepSpeed holds, logged after the first step


_state: _State | None = None


def _device(kwargs: dict) -> torch.device:
    if torch.cuda.is_available() and str(kwargs.get("device", "cpu")).startswith("cuda"):
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return torch.device("cpu")


def _deepspeed_conf(trainer) -> dict | None:
    """The DeepSpeed JSON the trainer will use, or None under DDP."""
    return read_ds_config(trainer.deepspeed_config) if trainer.use_deepspeed else None


def _autocast_dtype(ds_conf: dict | None) -> torch.dtype | None:
    """What funasr's trainer autocasts to (it reads the same two flags)."""
    if ds_conf is None:
        return None
    if ds_conf.get("bf16", {}).get("enabled"):
        return torch.bfloat16
    return torch.float16 if ds_conf.get("fp16", {}).get("enabled") else None


@contextlib.contextmanager
def _random_state_kept(device: torch.device) -> Iterator[None]:
    """Python's, numpy's and torch's generators (CPU, and the GPU's) as they were before the block."""
    py_state, np_state = random.getstate(), np.random.get_state()
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            yield
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)


def _memory_plan_and_probe(trainer, model: torch.nn.Module, kwargs: dict, opts: HookOptions) -> None:
    from funasr.register import tables
    from funasr.train_utils import trainer_ds
    from funasr.train_utils.device_funcs import to_device

    device = _device(kwargs)
    per = "GPU" if device.type == "cuda" else "process"
    ds_conf = _deepspeed_conf(trainer)
    zero = None if ds_conf is None else ZeroSettings.of(ds_conf)
    if zero is None:  # DDP: fp32 weights, gradients and Adam's two moments on every GPU
        params = sum(p.numel() for p in model.parameters() if p.requires_grad)
        states, how = 16 * params, "16 bytes per parameter (no ZeRO)"
        line = f"model states {states / GIB:.3f} GiB per {per}"
    else:
        plan = model_states(model, zero, opts.nproc_per_node, opts.nnodes)
        params, states, how = plan.params, plan.bytes_per_gpu, f"{zero.describe()}: {plan.how}"
        cpu = f"{plan.cpu_bytes_per_node / GIB:.3f} GiB of CPU memory per node"
        line = f"model states {states / GIB:.3f} GiB per {per}, {cpu}"
        if device.type == "cpu" and (zero.offload_optimizer or zero.offload_param):
            # On CPU the offloaded states stay in the process: the probe counts them as kept.
            kept = model_states(model, ZeroSettings(zero.stage), opts.nproc_per_node, opts.nnodes)
            states = kept.bytes_per_gpu
            line = (f"model states {plan.bytes_per_gpu / GIB:.3f} GiB per GPU, {cpu}; on CPU, where "
                    f"offloading moves nothing, {states / GIB:.3f} GiB per process")
    limit = (int(opts.memory_limit_gib * GIB) if opts.memory_limit_gib
             else default_limit(device, opts.nproc_per_node))
    log.info("memory plan: %.2f M trainable parameters; %s (%s); limit %.2f GiB", params / 1e6, line, how,
             limit / GIB)
    if not opts.oom_probe:
        return
    model.to(device)
    dtype = _autocast_dtype(ds_conf)

    def forward(batch: dict) -> torch.Tensor:
        with trainer_ds.maybe_autocast(dtype=dtype, use_deepspeed=trainer.use_deepspeed):
            return model(**batch)[0]

    # The probe must not change what training does: building the loader, dropout and augmentation draw
    # random numbers.
    with _random_state_kept(device):
        loader_class = tables.dataloader_classes.get(
            kwargs["dataset_conf"].get("dataloader", "DataloaderMapStyle"))
        train_loader, _ = loader_class(**kwargs).build_iter(epoch=0)
        dataset, collate = train_loader.dataset, train_loader.collate_fn
        batches = largest_batches(train_loader.batch_sampler, dataset.get_source_len)
        results = probe(model, batches, lambda idx: to_device(collate([dataset[i] for i in idx]), device),
                        forward, device)
    # The probe's weights and gradients are fp32; under DeepSpeed the states replace them (8 bytes each).
    extra = max(0, states - 8 * params)
    batch_size = int(kwargs["dataset_conf"].get("batch_size", 0))
    for r in results:
        what = (f"OOM probe, batch with the {r.batch.why}: {len(r.batch.indices)} utterances, longest "
                f"{r.batch.longest} frames, {r.batch.padded_frames} padded")
        if r.peak_bytes is None:
            raise OutOfMemoryPlan(f"{what}: out of memory on {device} in forward/backward "
                                  f"({r.seconds:.1f} s). To fit: {advice(batch_size, None)}")
        need = r.peak_bytes + extra
        log.info("%s: peak %.3f GiB + optimizer states %.3f GiB = %.3f GiB of %.2f GiB (%.0f%%), %.1f s",
                 what, r.peak_bytes / GIB, extra / GIB, need / GIB, limit / GIB, 100 * need / limit,
                 r.seconds)
        if need > limit:
            # What the batch itself adds scales with its size; the weights and the process do not.
            fits = max(0.0, limit - r.base_bytes - extra) / max(1, r.peak_bytes - r.base_bytes)
            raise OutOfMemoryPlan(f"{what}: needs {need / GIB:.2f} GiB, over the limit of {limit / GIB:.2f} "
                                  f"GiB per {per}. To fit: {advice(batch_size, min(fits, 1.0))}")
        if need > MEMORY_TARGET * limit:
            log.warning("%s uses %.0f%% of the memory (over %.0f%%): a longer batch later may not fit",
                        what, 100 * need / limit, 100 * MEMORY_TARGET)


def _log_held_states(engine) -> None:
    """What the engine's module and optimizer hold (train/memory.py ``held_tensor_bytes``), beside the
    memory plan's estimate: the plan's figure measured."""
    held = held_tensor_bytes(engine.module, getattr(engine, "optimizer", None))
    where = ", ".join(f"{size / GIB:.3f} GiB on {device}" for device, size in sorted(held.items()))
    log.info("model states after the first step: %s (measured: the weights, gradients and optimizer states "
             "DeepSpeed holds in this process)", where or "none")


def _grad_norm(model) -> float:
    if hasattr(model, "get_global_grad_norm"):  # DeepSpeed computed it for clipping
        value = model.get_global_grad_norm()
        return math.nan if value is None else float(value)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    return float(torch.nn.utils.get_total_norm(grads)) if grads else math.nan


def _start(trainer, scheduler, dataloader_train, state: _State) -> None:
    state.started = True
    state.log_interval = trainer.log_interval
    state.scheduler = scheduler
    if hasattr(scheduler, "set_total_steps"):
        scheduler.set_total_steps(trainer.max_epoch * len(dataloader_train))
    if state.opts.metrics_port and int(os.environ.get("LOCAL_RANK", 0)) == 0:
        try:
            state.exporter = Exporter(state.opts.metrics_port, int(os.environ.get("NODE_RANK", 0)))
        except OSError as e:  # a busy port must not stop a training run
            log.warning("metrics: cannot serve on port %d (%s); training goes on without them",
                        state.opts.metrics_port, e)


ALERT_EVERY_S = 600.0  # one warning of a kind per rank per ten minutes: a hint, not a flood


def _warn(snapshot: dict[str, float], state: _State) -> None:
    """Warn (rate-limited) when a log interval breaks the monitoring table's thresholds."""
    # The first intervals hold the start-up (compilation, the first batches' loading): not judged.
    if snapshot["step"] <= 2 * state.log_interval:
        return
    memory = util = None
    if torch.cuda.is_available():
        dev = torch.cuda.current_device()
        memory = torch.cuda.memory_reserved(dev) / torch.cuda.get_device_properties(dev).total_memory
        samples = state.exporter.last_gpu_samples if state.exporter is not None else []
        # NVML counts every GPU of the host, torch only the visible ones: a guess that holds unmasked.
        util = samples[dev][0] if dev < len(samples) else None
    found = alerts(snapshot, memory, util)
    if not torch.cuda.is_available():
        # CPU ranks share the cores: each waits in the collective for the others' compute, so the
        # GPU guides' 500 ms says nothing there.
        found.pop("allreduce", None)
    now = time.monotonic()
    for kind, text in found.items():
        if now - state.alerted.get(kind, -ALERT_EVERY_S) >= ALERT_EVERY_S:
            state.alerted[kind] = now
            log.warning("step %d: %s", snapshot["step"], text)


def install(opts: HookOptions) -> None:
    """Wrap the Trainer's methods (once per process)."""
    global _state
    if _state is not None:
        return
    from funasr.train_utils.trainer_ds import Trainer

    state = _State(opts)
    _state = state
    state.timer.install(replace)

    wrap = functools.partial(wrap_method, Trainer)

    @wrap("warp_model")
    def _(original, self, model, **kwargs):
        if opts.grad_checkpoint:
            from funasr_recipe.train.grad_checkpoint import enable

            enable(model)
        state.frames_per_input = int((kwargs.get("frontend_conf") or {}).get("lfr_n", 1) or 1)
        _memory_plan_and_probe(self, model, kwargs, opts)
        return original(self, model, **kwargs)

    @wrap("train_epoch")
    def _(original, self, *args, **kwargs):
        if not state.started:
            _start(self, kwargs.get("scheduler"), kwargs.get("dataloader_train"), state)
        return original(self, *args, **kwargs)

    @wrap("forward_step")
    def _(original, self, model, batch, loss_dict=None):
        if model.training:
            state.timer.reset()
            lengths = batch.get("speech_lengths")
            if lengths is not None:
                state.meter.batch(int(lengths.numel()), int(lengths.sum()) * state.frames_per_input)
        return original(self, model, batch, loss_dict=loss_dict)

    @wrap("update_step")
    def _(original, self, model, optim, scheduler, scaler, loss_dict=None):
        logged = (loss_dict["batch_idx"] + 1) % self.log_interval == 0
        if logged and not self.use_deepspeed:  # DDP zeroes the gradients in the step: measure before
            state.meter.grad_norm = _grad_norm(model)
        out = original(self, model, optim, scheduler, scaler, loss_dict=loss_dict)
        if logged and self.use_deepspeed:
            state.meter.grad_norm = _grad_norm(model)
        if not state.measured and self.use_deepspeed and self.rank == 0:
            state.measured = True  # once: the states are whole (every buffer made) after the first step
            _log_held_states(model)
        return out

    @wrap("log")
    def _(original, self, loss_dict=None, tag="train", **kwargs):
        out = original(self, loss_dict, tag=tag, **kwargs)
        if tag != "train":
            return out
        m, speed = state.meter, loss_dict["speed_stats"]
        m.step, m.epoch, m.learning_rate = loss_dict["batch_total"], loss_dict["epoch"], loss_dict["lr"]
        m.step_done(float(speed.get("data_load", 0)), float(speed.get("total_time", 0)))
        if (loss_dict["batch_idx"] + 1) % self.log_interval == 0:
            m.loss = float(loss_dict["loss"].detach())
            m.allreduce_seconds = state.timer.seconds()
            snapshot = m.snapshot()
            if state.exporter is not None:
                state.exporter.update(snapshot)
            if self.rank == 0:
                log.info("%s", log_line(snapshot))
            _warn(snapshot, state)
        return out

    @wrap("validate_epoch")
    def _(original, self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        if kwargs.get("step_in_epoch") is None:  # the end-of-epoch validation (funasr's main)
            # The all-rank mean funasr recorded: every rank's schedule must take the same decision.
            value = self.val_loss_step_or_epoch.get(f"model.pt.ep{kwargs.get('epoch')}", self.val_loss_avg)
            state.meter.valid_loss = float(value)
            if state.exporter is not None:
                state.exporter.set("valid_loss", float(value))
            if hasattr(state.scheduler, "observe_validation") and math.isfinite(float(value)):
                state.scheduler.observe_validation(float(value))
        return out

    log.info("trainer hooks installed: metrics port %s, grad checkpoint %s, OOM probe %s",
             opts.metrics_port or "off", opts.grad_checkpoint, opts.oom_probe)
    divergence.install(opts.max_bad_steps)  # last: its wrappers must run outside the ones above
