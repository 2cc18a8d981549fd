"""The recipe's learning-rate schedule: linear warmup, cosine decay to a floor, optional restarts.

Reads nothing; ``register()`` adds the scheduler to funasr's table ``funasr.schedulers.scheduler_classes``
under ``warmup_cosine``, and its state travels in the checkpoint (model.pt, or DeepSpeed's), so a
resumed run continues the same curve. A training config selects it with:

  scheduler: warmup_cosine
  scheduler_conf:
    warmup_steps: 25000     # linear from 0 to each param group's lr (the peak), in optimizer steps
    warmup_ratio: 0.0       # >0: warm up for this fraction of the run's steps instead (fine-tunes)
    final_lr_ratio: 0.01    # the floor, as a fraction of the peak, reached at total_steps
    restart_patience: 0     # >0: restart the cosine after this many validations without improvement

The trainer hook calls ``set_total_steps(max_epoch * batches_per_epoch)`` at the start of the first epoch
and ``observe_validation(loss)`` after each validation. In code:

  from funasr_recipe.train.lr_schedule import register; register()
"""

from __future__ import annotations

import logging
import math

import torch

from funasr_recipe.core.rejections import BadInputError

log = logging.getLogger(__name__)
NAME = "warmup_cosine"  # the key in funasr's scheduler table, and what configs write after ``scheduler:``


class WarmupCosineLR(torch.optim.lr_scheduler.LRScheduler):
    """Warmup for ``warmup_steps`` steps, then cosine from the peak down to ``final_lr_ratio * peak`` at
    ``total_steps``, and the floor after it; while ``total_steps`` is 0 (unknown) the peak is held.

    Steps are optimizer steps counted from 1, as funasr and DeepSpeed call ``.step()`` once after each:
    after ``last_epoch`` calls the lr is the one of step ``last_epoch + 1``, so the first step trains at
    peak / warmup_steps (not 0), the peak is reached at step ``warmup_steps`` and the floor at the last
    step, ``total_steps``. With ``restart_patience > 0``, ``observe_validation`` restarts the cosine from the
    current step (back to the peak, no second warmup) after that many validations without a new best.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, warmup_steps: int = 25000,
                 final_lr_ratio: float = 0.01, total_steps: int = 0, restart_patience: int = 0,
                 warmup_ratio: float = 0.0, last_epoch: int = -1) -> None:
        if warmup_steps < 0:
            raise BadInputError(f"{NAME}: warmup_steps must be >= 0, got {warmup_steps}")
        if not 0.0 <= warmup_ratio < 1.0:
            raise BadInputError(f"{NAME}: warmup_ratio must be in [0, 1), got {warmup_ratio}")
        if not 0.0 <= final_lr_ratio <= 1.0:
            raise BadInputError(f"{NAME}: final_lr_ratio must be in [0, 1], got {final_lr_ratio}")
        if restart_patience < 0:
            raise BadInputError(f"{NAME}: restart_patience must be >= 0, got {restart_patience}")
        # Everything the curve depends on is a plain attribute: LRScheduler.state_dict() saves __dict__
        # (less the optimizer) and load_state_dict() restores it, so resume needs no code of its own, and
        # plain ints/floats/None keep torch.load(weights_only=True) working.
        self.warmup_steps = int(warmup_steps)
        self.warmup_ratio = float(warmup_ratio)
        self.final_lr_ratio = float(final_lr_ratio)
        self.restart_patience = int(restart_patience)
        self.total_steps = 0
        self.cycle_start = self.warmup_steps  # where the current cosine begins: end of warmup or a restart
        self.best_loss: float | None = None
        self.bad_validations = 0  # consecutive validations without a new best
        self.restarts = 0
        if total_steps:
            self._check_total(int(total_steps))
            self.total_steps = int(total_steps)
        # Set before the base __init__, which takes the first step and so already calls get_lr().
        super().__init__(optimizer, last_epoch)

    def _check_total(self, n: int) -> None:
        if n <= 0:
            raise BadInputError(f"{NAME}: total_steps must be a positive number of optimizer steps, got {n}")
        if self.warmup_steps >= n:
            raise BadInputError(f"{NAME}: warmup_steps ({self.warmup_steps}) must be below total_steps "
                                f"({n}): the warmup would never end before training does; lower warmup_steps")

    def set_total_steps(self, n: int) -> None:
        """Fix where the cosine reaches the floor; the same ``n`` again (as on resume) changes nothing. A
        warmup as long as the run is shortened to a tenth of it, with a warning."""
        n = int(n)
        if n == self.total_steps:
            return
        if self.warmup_ratio and not self.total_steps and self.last_epoch <= 0:
            # A fine-tune's length varies with its corpus by orders of magnitude: a fixed warmup of 1000
            # steps kept a run of a few hundred utterances near zero throughout. Scaled to the run, the
            # warmup is the same share of it whatever the corpus (set once, at the start: a resumed run
            # keeps the curve it began with).
            self.warmup_steps = max(1, round(self.warmup_ratio * n))
            self.cycle_start = self.warmup_steps
            log.info("%s: warming up for %d of the run's %d steps (warmup_ratio %g)", NAME, self.warmup_steps,
                     n, self.warmup_ratio)
        if 0 < n <= self.warmup_steps:
            # A short fine-tune with a config's warmup for a long one: warm up for a tenth of the run
            # instead of never leaving the warmup (or stopping the run here).
            short = max(1, n // 10)
            log.warning("%s: warmup_steps %d is not below this run's %d steps; warming up for %d instead "
                        "(set ++scheduler_conf.warmup_steps to choose)", NAME, self.warmup_steps, n, short)
            if self.cycle_start == self.warmup_steps:
                self.cycle_start = short
            self.warmup_steps = short
        self._check_total(n)
        if self.total_steps:
            # e.g. resumed on a different number of GPUs: batches per epoch changed, so does the curve.
            log.warning("%s: total_steps changes from %d to %d at step %d", NAME, self.total_steps, n,
                        self.last_epoch)
        self.total_steps = n
        self._apply_lr()  # the next optimizer step must already see the new curve

    def _factor(self, step: int) -> float:
        """The lr as a fraction of the peak at ``step``."""
        if step < self.warmup_steps:
            return step / self.warmup_steps
        if not self.total_steps:
            return 1.0
        span = self.total_steps - self.cycle_start
        progress = 1.0 if span <= 0 else min(max((step - self.cycle_start) / span, 0.0), 1.0)
        floor = self.final_lr_ratio
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))

    def get_lr(self) -> list[float]:
        # Closed form from the step, not chained from the last lr: a loaded state gives the same value.
        factor = self._factor(self.last_epoch + 1)
        return [base * factor for base in self.base_lrs]

    def _apply_lr(self) -> None:
        lrs = self.get_lr()
        for group, lr in zip(self.optimizer.param_groups, lrs, strict=True):
            if isinstance(group["lr"], torch.Tensor):
                group["lr"].fill_(float(lr))
            else:
                group["lr"] = lr
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def observe_validation(self, loss: float) -> bool:
        """Record one validation loss; True when this restarted the cosine (lr back at the peak now).

        A restart needs ``restart_patience`` consecutive validations without a new best, a known
        ``total_steps``, and a step between the end of warmup and ``total_steps`` (in warmup the lr has
        not decayed yet; after total_steps there is no room left for another decay).
        """
        loss = float(loss)
        if self.best_loss is None or loss < self.best_loss:  # NaN never counts as an improvement
            self.best_loss = loss
            self.bad_validations = 0
            return False
        self.bad_validations += 1
        step = self.last_epoch
        if not (self.restart_patience and self.bad_validations >= self.restart_patience
                and self.total_steps and self.warmup_steps <= step < self.total_steps):
            return False
        log.info("%s: lr restarts at the peak at step %d after %d epochs without improvement "
                 "(best loss %.4f); decays again to the floor at step %d", NAME, step,
                 self.bad_validations, self.best_loss, self.total_steps)
        self.cycle_start = step + 1  # the next optimizer step is at the peak
        self.bad_validations = 0
        self.restarts += 1
        self._apply_lr()
        return True


def register() -> None:
    """Put WarmupCosineLR into funasr's scheduler table as ``warmup_cosine``; calling it again is harmless.

    Configs select it with ``scheduler: warmup_cosine`` and
    ``scheduler_conf: {warmup_steps: ..., final_lr_ratio: 0.01, restart_patience: 0}``.
    """
    from funasr.schedulers import scheduler_classes  # imported here: funasr is slow to import

    scheduler_classes[NAME] = WarmupCosineLR
