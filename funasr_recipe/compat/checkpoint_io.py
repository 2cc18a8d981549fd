"""Atomic checkpoints for funasr 1.4.16's trainer: a kill during a write leaves the last complete
checkpoint in place, and the next start resumes from it.

funasr writes straight into its checkpoints' final names (DeepSpeed: ``model.save_checkpoint`` into the
tag dirs <exp>/model.pt.ep<N>, <exp>/model.pt, <exp>/model.pt.best and the ``latest`` file; DDP:
``torch.save`` of the same names as files), and resumes from <exp>/model.pt whatever state it is in:
a kill in the middle of epoch N's write left a truncated model.pt that no later start could load.
``install()`` wraps ``Trainer.save_checkpoint`` and ``Trainer.resume_checkpoint`` (funasr has no callback
API; the originals run unchanged; compat/patching.py) so that, for every checkpoint <name>:

1. every rank writes its part under <exp>/.tmp.<name> and fsyncs each file it wrote;
2. a barrier: rank 0 renames only once every rank's shards are on disk (DeepSpeed: each rank writes its
   own ZeRO shard);
3. rank 0 fsyncs the temporary dir, moves a previous <name> dir aside to .old.<name> (rename cannot
   replace a directory), renames .tmp.<name> to <name>, fsyncs <exp> and removes .old.<name>;
4. order: the epoch's own checkpoint, then model.pt.best, then model.pt and ``latest`` (the pointers
   resume reads) last, then funasr's pruning of the worst checkpoint.
On the next start (``resume_checkpoint``) rank 0 removes every .tmp.* and puts back an .old.<name> whose
<name> is missing (a kill between the two renames), logging each, before funasr resumes; after the
resume it checks model.pt.best and ``saved_ckpts`` against the state model.pt holds (``check_kept``).

Reads  <exp>/ (leftovers, model.pt.best's recorded name); writes <exp>/ checkpoints as above.

Fault injection, for the tests only and off unless set: FUNASR_RECIPE_CKPT_KILL=<name>:<epoch>[:<rank>]
(e.g. ``model.pt:2:0``) makes that global rank (default 0) write half of its first file of checkpoint
<name> in the save_checkpoint call for <epoch> (the N of model.pt.ep<N>) and SIGKILL itself, as a kill
during the write would leave it. ``install(atomic=False)`` keeps only this, on funasr's own writes.

  install()            # once per rank, before funasr's train_ds.main_hydra
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import io
import logging
import os
import shutil
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from funasr_recipe.compat.patching import replaced, wrap_method
from funasr_recipe.core.rejections import BadInputError
from funasr_recipe.model.checkpoint import client_state_file

log = logging.getLogger(__name__)
TMP, OLD = ".tmp.", ".old."
POINTER, BEST = "model.pt", "model.pt.best"
KILL_ENV = "FUNASR_RECIPE_CKPT_KILL"
_installed = False


@dataclass(frozen=True)
class Kill:
    """Where FUNASR_RECIPE_CKPT_KILL says to die: checkpoint name, epoch, global rank."""

    name: str
    epoch: int
    rank: int = 0

    @classmethod
    def from_env(cls) -> Kill | None:
        spec = os.environ.get(KILL_ENV, "")
        if not spec:
            return None
        parts = spec.split(":")
        if len(parts) not in (2, 3) or not all(p.isdigit() for p in parts[1:]):
            raise BadInputError(f"{KILL_ENV}={spec!r}: expected <checkpoint name>:<epoch>[:<rank>]")
        return cls(parts[0], *(int(p) for p in parts[1:]))


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:
        if not path.is_dir():
            raise
        # Some filesystems (FUSE mounts, some NFS clients) refuse fsync on a directory; the renames are
        # then as durable as that filesystem makes them.
    finally:
        os.close(fd)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def _barrier() -> None:
    if not (dist.is_available() and dist.is_initialized()):
        return
    if dist.get_backend() == "nccl":
        # NCCL's barrier otherwise guesses the GPU from the rank; the engine has set this rank's.
        dist.barrier(device_ids=[torch.cuda.current_device()])
    else:
        dist.barrier()


def swap_in(tmp: Path, final: Path) -> None:
    """Put the complete ``tmp`` (a file or a dir) at ``final``; a kill at any point leaves either the old
    or the new ``final``, or the old one at .old.<name> where ``recover`` finds it."""
    old = final.with_name(OLD + final.name)
    _remove(old)
    if (final.is_dir() and not final.is_symlink()) or (final.exists() and final.is_dir() != tmp.is_dir()):
        os.rename(final, old)
    os.replace(tmp, final)
    _fsync(final.parent)
    _remove(old)


def write_pointer_file(exp: Path, name: str, content: str) -> None:
    """A small file (DeepSpeed's ``latest``) replaced in one rename."""
    tmp = exp / (TMP + name)
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(content)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, exp / name)
    _fsync(exp)


def recover(exp: Path) -> list[str]:
    """Clean up after a write that was killed: remove .tmp.* and put back an .old.<name> whose <name> is
    gone. Returns what it did, one line each (also logged)."""
    done: list[str] = []
    if not exp.is_dir():
        return done
    for entry in sorted(exp.iterdir()):
        if entry.name.startswith(TMP):
            _remove(entry)
            done.append(f"removed {entry}: a checkpoint write that never finished (the run was killed "
                        "during it); resuming from the last complete checkpoint")
        elif entry.name.startswith(OLD):
            final = entry.with_name(entry.name[len(OLD):])
            if final.exists():
                _remove(entry)
                done.append(f"removed {entry}: the replaced copy of {final.name}")
            else:
                os.rename(entry, final)
                done.append(f"put back {final} from {entry.name}: the run was killed while replacing it")
    if done:
        _fsync(exp)
    for line in done:
        log.warning("%s", line)
    return done


def recorded_best(checkpoint: Path) -> str | None:
    """The ``best_step_or_epoch`` a checkpoint's own state names (a best copy names its source)."""
    path = client_state_file(checkpoint)  # ZeRO-3: rank 0's model-states file
    try:
        # mmap: a ddp checkpoint file holds the optimizer state too, and one key is needed.
        state = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except RuntimeError:  # a legacy (non-zip) file cannot be mapped
        state = torch.load(path, map_location="cpu", weights_only=True)
    return state.get("best_step_or_epoch") or None


def check_kept(exp: Path, best: str, saved: dict[str, float]) -> list[str]:
    """After a resume: make model.pt.best the copy of ``best`` (the resumed state's) again where a kill
    between their renames left it another checkpoint's, and name the kept checkpoints that are gone.
    Returns the warnings (also logged)."""
    warnings = []
    if gone := sorted(n for n in saved if not (exp / n).exists()):
        warnings.append(f"saved_ckpts lists {', '.join(gone)}, no longer in {exp}; stage 3 averages the rest")
    best_path = exp / BEST
    try:
        have = recorded_best(best_path) if best_path.exists() else None
    except Exception as e:  # a check after the resume must not stop the training it checks
        log.warning("%s: cannot read which checkpoint it copies (%s); not checked", best_path, e)
        return warnings
    if best and have != best:
        source = exp / best
        if source.exists():
            tmp = exp / (TMP + BEST)
            _remove(tmp)
            if source.is_dir():
                shutil.copytree(source, tmp)
                for f in tmp.iterdir():
                    _fsync(f)
            else:
                shutil.copy2(source, tmp)
            _fsync(tmp)
            swap_in(tmp, best_path)
            warnings.append(f"{best_path} held {have or 'nothing'}, the resumed state's best is {best}: "
                            f"copied {source.name} to it")
        else:
            warnings.append(f"{best_path} holds {have or 'nothing'}, the resumed state's best {best} is not "
                            f"in {exp}")
    for line in warnings:
        log.warning("%s", line)
    return warnings


class _Writer:
    """One ``save_checkpoint`` call: stages each checkpoint, commits it, the pointer last."""

    def __init__(self, exp: Path, epoch: int, rank: int, atomic: bool, kill: Kill | None) -> None:
        self.exp, self.epoch, self.rank, self.atomic, self.kill = exp, epoch, rank, atomic, kill
        self.first: str | None = None  # the epoch's own checkpoint: funasr saves it first
        self.pointer: tuple[Path, Path] | None = None  # model.pt, staged, waiting for model.pt.best

    def name_of(self, path: Path) -> str | None:
        """The checkpoint a written file belongs to, or None for a file outside <exp>."""
        try:
            top = Path(os.path.abspath(path)).relative_to(self.exp).parts[0]
        except (ValueError, IndexError):
            return None
        return top.removeprefix(TMP)

    def commit(self, tmp: Path, final: Path, state: dict) -> None:
        """Rank 0: rename into place; model.pt waits for model.pt.best when funasr is about to write it
        (the saved state names this epoch's checkpoint as the best)."""
        if final.name == POINTER:
            self.pointer = (tmp, final)
            if state.get("best_step_or_epoch") != self.first or self.first is None:
                self.finish()
            return
        swap_in(tmp, final)
        if final.name == BEST:
            self.finish()

    def finish(self) -> None:
        if self.pointer is None:
            return
        tmp, final = self.pointer
        self.pointer = None
        swap_in(tmp, final)
        if final.is_dir():
            write_pointer_file(self.exp, "latest", POINTER)

    def die_half_written(self, save: Callable, obj: Any, target: Path, args: tuple, kwargs: dict) -> None:
        """The fault injection: the file cut where a kill in the middle of its write leaves it."""
        buf = io.BytesIO()
        save(obj, buf, *args, **kwargs)
        data = buf.getvalue()
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "wb") as f:
            f.write(data[: len(data) // 2])
            f.flush()
            os.fsync(f.fileno())
        log.warning("%s=%s: killing rank %d with %s half written", KILL_ENV, os.environ[KILL_ENV], self.rank,
                    target)
        for handler in logging.getLogger().handlers:
            handler.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    def torch_save(self, save: Callable) -> Callable:
        @functools.wraps(save)
        def wrapped(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
            name = self.name_of(Path(f)) if isinstance(f, str | os.PathLike) else None
            if name is None:
                return save(obj, f, *args, **kwargs)
            path = Path(f)
            self.first = self.first or name
            # DDP: a whole checkpoint is one file of <exp>, staged beside it.
            whole = self.atomic and Path(os.path.abspath(path)).parent == self.exp
            target = path.with_name(TMP + path.name) if whole else path
            if self.kill == Kill(name, self.epoch, self.rank):
                self.die_half_written(save, obj, target, args, kwargs)
            save(obj, target, *args, **kwargs)
            if self.atomic:
                _fsync(target)
            if whole:
                self.commit(target, path, obj if isinstance(obj, dict) else {})
        return wrapped

    def engine_save(self, save: Callable) -> Callable:
        """DeepSpeed's ``engine.save_checkpoint`` into .tmp.<tag>, then the barrier and rank 0's rename."""
        @functools.wraps(save)
        def wrapped(save_dir: str, tag: Any = None, client_state: dict | None = None,
                    save_latest: bool = True, **kwargs: Any) -> Any:
            client_state = {} if client_state is None else client_state
            if tag is None or os.path.abspath(save_dir) != str(self.exp):
                return save(save_dir, tag=tag, client_state=client_state, save_latest=save_latest, **kwargs)
            tag = str(tag)
            self.first = self.first or tag
            tmp, final = self.exp / (TMP + tag), self.exp / tag
            if self.rank == 0:
                # Before the engine's own first barrier: no rank writes into it yet.
                _remove(tmp)
            # The tag is the same string on every rank (DeepSpeed checks); ``latest`` is ours to write.
            done = save(save_dir, tag=tmp.name, client_state=client_state, save_latest=False, **kwargs)
            _barrier()
            if self.rank == 0:
                _fsync(tmp)
                self.commit(tmp, final, client_state)
            return done
        return wrapped

    @contextlib.contextmanager
    def patched(self, model: Any, use_deepspeed: bool) -> Iterator[None]:
        """torch.save (every file funasr and DeepSpeed write) and the engine's save, for this call only."""
        engine = use_deepspeed and self.atomic and model is not None and hasattr(model, "save_checkpoint")
        with contextlib.ExitStack() as stack:
            stack.enter_context(replaced(torch, "save", self.torch_save(torch.save)))
            if engine:
                # An instance attribute shadows the method for this call; leaving removes it again.
                engine_save = self.engine_save(model.save_checkpoint)
                stack.enter_context(replaced(model, "save_checkpoint", engine_save))
            yield


def install(atomic: bool = True) -> None:
    """Wrap the Trainer's save_checkpoint and resume_checkpoint (once per process). ``atomic=False`` keeps
    funasr's own writes and only the fault injection: what a kill does without this module (tests)."""
    global _installed
    if _installed:
        return
    _installed = True
    from funasr.train_utils.trainer_ds import Trainer

    signature = inspect.signature(Trainer.save_checkpoint)
    kill = Kill.from_env()
    wrap = functools.partial(wrap_method, Trainer)

    @wrap("save_checkpoint")
    def _(save, self, *args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(self, *args, **kwargs).arguments
        writer = _Writer(Path(os.path.abspath(self.output_dir)), int(bound["epoch"]), self.rank, atomic, kill)
        with writer.patched(bound.get("model"), self.use_deepspeed):
            out = save(self, *args, **kwargs)
        if self.rank == 0:
            writer.finish()  # model.pt, if funasr did not write the best copy it was held back for
        return out

    @wrap("resume_checkpoint")
    def _(resume, self, *args: Any, **kwargs: Any) -> Any:
        exp = Path(os.path.abspath(self.output_dir))
        if atomic and self.rank == 0:
            recover(exp)
        _barrier()
        out = resume(self, *args, **kwargs)
        if atomic and self.rank == 0 and (exp / POINTER).exists():
            check_kept(exp, self.best_step_or_epoch, dict(self.saved_ckpts))
        return out
