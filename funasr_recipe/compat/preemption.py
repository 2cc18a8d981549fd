"""Mid-epoch checkpoints on SIGTERM and every N minutes, on funasr 1.4.16's trainer.

Slurm (preemption, time limit, scancel), Kubernetes and torchrun's own shutdown send SIGTERM, then
SIGKILL after a grace period (torchrun: 30 s to its workers). funasr saves at epoch ends (and every
``save_checkpoint_interval`` steps, 5000 by default), so a SIGTERM lost up to an epoch. Here:

- each rank's SIGTERM handler only notes the signal, and stops the DataLoader from raising over its
  workers, which torchrun's signal to the rank's process group kills (no batch is fetched after it);
- after every update, the ranks agree in one all-reduce (MAX of [a signal was seen, rank 0's clock says
  a timed checkpoint is due]): a signal reaches the ranks at different steps, and DeepSpeed's save is
  collective, so every rank must save at the same step;
- every rank then saves through funasr's own step checkpoint (model.pt.ep<E>.<S>, and model.pt with
  ``step`` and ``step_in_epoch``, which funasr's resume hands the batch sampler as ``start_step``: a rerun
  continues with the next batch of the same epoch, data/batch_sampler.py skipping the ones done). Only
  the newest checkpoint made here is kept; funasr's epoch checkpoints are untouched;
- after a signal, rank 0 writes <exp-dir>/preempted.json (epoch, step, checkpoint, seconds from the
  signal to the saved checkpoint) and every rank exits with EXIT_PREEMPTED (75, EX_TEMPFAIL: run again).

A signal during validation or a checkpoint write is acted on at the next update. Reads
``train_conf.checkpoint_minutes`` (0 or unset: no timed checkpoints); writes the checkpoints and
<exp-dir>/preempted.json.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from funasr_recipe.compat.patching import wrap_method

log = logging.getLogger(__name__)

EXIT_PREEMPTED = 75
PREEMPTED = "preempted.json"
# The step checkpoints made here, one name per line: an epoch's checkpoint supersedes them, also those a
# preempted process made before this one resumed. funasr's own interval checkpoints are not listed.
MADE = ".step_checkpoints"


@dataclass
class _State:
    minutes: float = 0.0
    signal_at: float | None = None  # time.monotonic() of the first SIGTERM
    last_save: float = field(default_factory=time.monotonic)


_state: _State | None = None


def _note_signal(signum: int, frame: object) -> None:
    if _state is not None and _state.signal_at is None:
        _state.signal_at = time.monotonic()  # no logging in a handler: it may interrupt a log call
    # torchrun signals the rank's whole process group, and torch's DataLoader workers die of it (their C
    # handler re-raises SIGTERM); the loader's SIGCHLD handler would then raise in the middle of this step.
    # The step in progress needs no more batches and the checkpoint none: let the workers go quietly.
    # (CPython looks a tripped signal's handler up when it runs it: a SIGCHLD pending now is dropped too.)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)


def _agree(trainer: object, signalled: bool, due: bool) -> tuple[bool, bool]:
    """Every rank's view, combined: (some rank was signalled, rank 0 says a timed checkpoint is due)."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return signalled, due
    flags = torch.tensor([float(signalled), float(due and dist.get_rank() == 0)], device=trainer.device)
    all_reduce = dist.all_reduce  # not through the hooks' gradient-sync timer (train/collectives.py)
    all_reduce = getattr(all_reduce, "__wrapped__", all_reduce)
    all_reduce(flags, op=dist.ReduceOp.MAX)
    return bool(flags[0]), bool(flags[1])


def _save(trainer: object, model: object, optim: object, scheduler: object, scaler: object,
          loss_dict: dict) -> str:
    epoch, step = loss_dict["epoch"], loss_dict["batch_idx"] + 1
    trainer.save_checkpoint(epoch, model=model, optim=optim, scheduler=scheduler, scaler=scaler, step=step,
                            step_in_epoch=trainer.step_in_epoch,
                            data_split_i=loss_dict.get("data_split_i", 0),
                            data_split_num=loss_dict.get("data_split_num", 1),
                            train_loss_avg=trainer.train_loss_avg, train_acc_avg=trainer.train_acc_avg)
    name = f"model.pt.ep{epoch}.{trainer.step_in_epoch}"
    if trainer.rank == 0:  # the step checkpoints made before this one: model.pt holds the newest
        _supersede(Path(trainer.output_dir), keep=name)
    return name


def _supersede(exp_dir: Path, keep: str | None) -> None:
    """Remove the listed step checkpoints but ``keep``, and list ``keep`` alone."""
    listing = exp_dir / MADE
    names = listing.read_text().split() if listing.is_file() else []
    for name in names:
        path = exp_dir / name
        if name == keep:
            continue
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    listing.write_text(f"{keep}\n" if keep else "")


def _exit_preempted(trainer: object, loss_dict: dict, name: str, state: _State) -> None:
    import torch.distributed as dist

    seconds = time.monotonic() - (state.signal_at or time.monotonic())
    if trainer.rank == 0:
        out = Path(trainer.output_dir) / PREEMPTED
        out.write_text(json.dumps({"epoch": loss_dict["epoch"], "step_in_epoch": trainer.step_in_epoch,
                                   "total_step": trainer.batch_total, "checkpoint": name,
                                   "seconds_to_save": round(seconds, 2)}) + "\n")
    log.warning("SIGTERM: checkpoint %s saved at epoch %d, step %d of the epoch, %.1f s after the signal; "
                "exiting %d (a rerun continues from the next batch)", name, loss_dict["epoch"],
                trainer.step_in_epoch, seconds, EXIT_PREEMPTED)
    if dist.is_available() and dist.is_initialized():
        dist.barrier()  # every rank's part of the checkpoint is written before any rank leaves
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    # Not sys.exit: funasr's loop and DeepSpeed's atexit handlers would go on to tear down collectives the
    # other ranks are leaving too, and torchrun is already shutting the group down.
    os._exit(EXIT_PREEMPTED)


def install() -> None:
    """The SIGTERM handler and the per-update check (once per process)."""
    global _state
    if _state is not None:
        return
    from funasr.train_utils.trainer_ds import Trainer

    state = _State()
    _state = state
    signal.signal(signal.SIGTERM, _note_signal)
    wrap = functools.partial(wrap_method, Trainer)

    @wrap("warp_optim_scheduler")
    def _(original, self, model, **kwargs):
        state.minutes = float((kwargs.get("train_conf") or {}).get("checkpoint_minutes") or 0)
        state.last_save = time.monotonic()
        return original(self, model, **kwargs)

    @wrap("save_checkpoint")
    def _(original, self, epoch, step=None, **kwargs):
        out = original(self, epoch, step=step, **kwargs)
        state.last_save = time.monotonic()  # any checkpoint restarts the clock
        if step is None and self.rank == 0:  # an epoch's checkpoint supersedes the step ones made in it
            _supersede(Path(self.output_dir), keep=None)
        return out

    @wrap("update_step")
    def _(original, self, model, optim, scheduler, scaler, loss_dict=None):
        out = original(self, model, optim, scheduler, scaler, loss_dict=loss_dict)
        due = state.minutes > 0 and time.monotonic() - state.last_save >= 60 * state.minutes
        signalled, due = _agree(self, state.signal_at is not None, due)
        if signalled or due:
            if signalled and state.signal_at is None:  # another rank's signal: count from now
                state.signal_at = time.monotonic()
            name = _save(self, model, optim, scheduler, scaler, loss_dict)
            if signalled:
                _exit_preempted(self, loss_dict, name, state)
            log.info("timed checkpoint %s (every %g min)", name, state.minutes)
        return out
