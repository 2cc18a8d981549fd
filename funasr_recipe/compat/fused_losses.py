"""The losses over funasr's wide output layers, computed in fewer passes; the same values and gradients.

SenseVoiceSmall's output layer is 25,055 wide (the unmodified class hard-codes its tag ids there, so
even a 500-piece tokenizer keeps it), and funasr 1.4.16 computes its two losses over it the
straightforward way. Profiled on the demo's tiny SenseVoice (2 CPU processes, DeepSpeed bf16), ops over
(frames, 25055) tensors took at least 73% of a training step:

- ``CTC.forward``: the output layer runs on every padded frame; the bf16 logits are copied to fp32 for
  ``log_softmax``; CTC's backward fills and exponentiates a (T, B, 25055) gradient; and with
  ``ignore_nan_grad`` (its default) it runs that backward twice, once inside the forward
  (``loss.grad_fn(...)``) only to see which utterances have a non-finite gradient.
- ``LabelSmoothingLoss.forward`` (SenseVoice's 4 prompt frames, Paraformer's decoder): a full
  target-distribution tensor, ``log_softmax``, ``kl_div`` (``xlogy``) and their backwards.
- ``th_accuracy``: ``argmax`` over the classes, which on CPU takes about 3x ``max(dim)`` for the same
  first-maximum indices.

Here, the same mathematics:

- CTC: the output layer on the valid frames only; per frame one log-sum-exp over the classes; the CTC
  recursion (torch's own ``ctc_loss``) over just the blank and the classes the batch's targets use,
  whose log-probabilities are all the loss depends on; the gradient w.r.t. the logits is
  ``g * (softmax - occupancy)``, written in one pass (torch's CTC backward gives exactly that for
  the classes it saw). ``ignore_nan_grad`` keeps its meaning (utterances whose loss is not finite,
  i.e. whose gradient would not be, are left out and the mean is over the rest) without the second
  backward: for CTC, a non-finite gradient comes with a non-finite loss.
- Label smoothing: the KL divergence to the smoothed targets in closed form, ``C - s * sum(log p) -
  (conf - s) * log p_y``, gradient ``softmax - targets`` in one pass. The targets are fp32;
  funasr builds them in the logits' dtype (under bf16 autocast its confidence 0.9 is 0.8984).
- Accuracy: ``max(dim).indices``.

On CPU the passes go over blocks of rows that fit in cache (one pass over the whole tensor on CUDA).
tests/unit/compat/test_fused_losses.py checks values and gradients against funasr's own code, in fp32 and
bf16.

Reads and writes nothing; ``apply()`` patches funasr's classes in place (idempotent, through
compat/patching.py), as compat/install.py does before the model is built.
"""

from __future__ import annotations

import functools
import logging
import math
import sys

import torch
import torch.nn.functional as F

from funasr_recipe.compat.patching import replace

log = logging.getLogger(__name__)
BLOCK_BYTES = 2 << 20  # fp32 rows per block on CPU: about an L2 cache
_applied = False
ACCURACY = "funasr.metrics.compute_acc.th_accuracy"  # where funasr defines it


def _blocks(rows: int, width: int, device: torch.device) -> list[slice]:
    if device.type != "cpu":
        return [slice(0, rows)]
    step = max(1, BLOCK_BYTES // (4 * width))
    return [slice(i, min(i + step, rows)) for i in range(0, rows, step)]


def row_logsumexp(z: torch.Tensor, with_sum: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """fp32 log-sum-exp of each row of a 2-D tensor (and the row sums), block by block."""
    lse = torch.empty(z.shape[0], dtype=torch.float32, device=z.device)
    total = torch.empty_like(lse) if with_sum else None
    for s in _blocks(*z.shape, z.device):
        block = z[s].float()
        lse[s] = torch.logsumexp(block, 1)
        if total is not None:
            total[s] = block.sum(1)
    return lse, total


def _softmax_times(z: torch.Tensor, lse: torch.Tensor, scale: torch.Tensor,
                   shift: float = 0.0) -> torch.Tensor:
    """``(softmax(z) - shift) * scale[:, None]`` in z's dtype, block by block."""
    out = torch.empty_like(z)
    for s in _blocks(*z.shape, z.device):
        out[s] = ((torch.exp(z[s].float() - lse[s, None]) - shift) * scale[s, None]).to(z.dtype)
    return out


class _CtcOverClasses(torch.autograd.Function):
    """Per-utterance CTC loss from the logits of the valid frames (N, V), rows in (utterance, frame)
    order; the recursion sees only ``cols`` (sorted, blank 0 first)."""

    @staticmethod
    def forward(ctx, z, rows_b, rows_t, frames, cols, targets, in_lens, tgt_lens):  # noqa: ANN001
        lse, _ = row_logsumexp(z)
        lp_rows = z[:, cols].float() - lse[:, None]
        batch = int(in_lens.shape[0])
        lp = lp_rows.new_zeros((frames, batch, cols.numel()))
        lp[rows_t, rows_b] = lp_rows
        with torch.enable_grad():
            x = lp.requires_grad_()
            loss = F.ctc_loss(x, targets, in_lens, tgt_lens, blank=0, reduction="none", zero_infinity=False)
            (grad,) = torch.autograd.grad(loss.sum(), x)
        ctx.save_for_backward(z, lse, grad[rows_t, rows_b], rows_b, cols)
        return loss.detach()

    @staticmethod
    def backward(ctx, g):  # noqa: ANN001
        z, lse, grad_cols, rows_b, cols = ctx.saved_tensors
        g_rows = g[rows_b].float()
        out = _softmax_times(z, lse, g_rows)
        # torch's CTC gradient for the classes it saw is already g * (softmax - occupancy); an utterance
        # left out (g = 0) may have a NaN there (an impossible alignment) and must give 0.
        cols_part = (grad_cols * g_rows[:, None]).masked_fill((g_rows == 0)[:, None], 0.0)
        out[:, cols] = cols_part.to(z.dtype)
        return out, None, None, None, None, None, None, None


class _SmoothedCrossEntropy(torch.autograd.Function):
    """Per-row KL divergence from label-smoothed targets to softmax(z): z (N, V), y (N,) in [0, V)."""

    @staticmethod
    def forward(ctx, z, y, smoothing):  # noqa: ANN001
        width = z.shape[1]
        off = smoothing / (width - 1)
        conf = 1.0 - smoothing
        const = (conf * math.log(conf) if conf > 0 else 0.0) + (smoothing * math.log(off) if off > 0 else 0.0)
        lse, total = row_logsumexp(z, with_sum=True)
        lp_y = z.gather(1, y[:, None])[:, 0].float() - lse
        ctx.save_for_backward(z, lse, y)
        ctx.off, ctx.conf = off, conf
        return const - off * (total - width * lse) - (conf - off) * lp_y

    @staticmethod
    def backward(ctx, g):  # noqa: ANN001
        z, lse, y = ctx.saved_tensors
        g = g.float()
        out = _softmax_times(z, lse, g, shift=ctx.off)
        out.scatter_add_(1, y[:, None], (-(ctx.conf - ctx.off) * g[:, None]).to(z.dtype))
        return out, None, None


def ctc_forward(self, hs_pad: torch.Tensor, hlens: torch.Tensor, ys_pad: torch.Tensor,
                ys_lens: torch.Tensor) -> torch.Tensor:
    """funasr's ``CTC.forward`` (builtin CTC): the batch's CTC loss, as funasr reduces it."""
    hs = F.dropout(hs_pad, p=self.dropout_rate)  # as funasr's: not gated on self.training
    batch, frames = hs.shape[:2]
    hlens = hlens.to(hs.device)
    valid = torch.arange(frames, device=hs.device)[None, :] < hlens[:, None]
    rows_b, rows_t = valid.nonzero(as_tuple=True)
    z = self.ctc_lo(hs[rows_b, rows_t])
    targets = torch.cat([ys_pad[i, :n] for i, n in enumerate(ys_lens)])
    cols = torch.unique(torch.cat([targets.new_zeros(1), targets]))
    loss = _CtcOverClasses.apply(z, rows_b, rows_t, frames, cols, torch.searchsorted(cols, targets),
                                 hlens, ys_lens)
    size = batch
    if loss.requires_grad and self.ignore_nan_grad:
        finite = torch.isfinite(loss.detach())
        size = int(finite.sum())
        if size == 0:
            log.warning("All samples in this mini-batch got nan grad. "
                        "Returning nan value instead of CTC loss")
        elif size != batch:
            log.warning("%d/%d samples got nan grad. These were ignored for CTC loss.", batch - size, batch)
            loss = loss[finite]
    loss = loss.sum() / size if self.reduce else loss / size
    return loss.to(device=hs_pad.device, dtype=hs_pad.dtype)


def label_smoothing_forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """funasr's ``LabelSmoothingLoss.forward``: summed KL over the non-padding rows / the denominator."""
    assert x.size(2) == self.size
    batch_size = x.size(0)
    rows = x.contiguous().view(-1, self.size)
    target = target.contiguous().view(-1)
    ignore = target == self.padding_idx
    total = len(target) - int(ignore.sum())
    kl = _SmoothedCrossEntropy.apply(rows, target.masked_fill(ignore, 0), float(self.smoothing))
    denom = total if self.normalize_length else batch_size
    return kl.masked_fill(ignore, 0).sum() / denom


def th_accuracy(pad_outputs: torch.Tensor, pad_targets: torch.Tensor, ignore_label: int) -> float:
    """funasr's ``th_accuracy`` (the first maximum is the prediction, as argmax's)."""
    pad_pred = pad_outputs.view(pad_targets.size(0), pad_targets.size(1), pad_outputs.size(1)).max(2).indices
    mask = pad_targets != ignore_label
    numerator = torch.sum(pad_pred.masked_select(mask) == pad_targets.masked_select(mask))
    return float(numerator) / float(torch.sum(mask))


def _unless_unusual(fast, original, usual):  # noqa: ANN001, ANN202
    """Use ``fast`` only on the configurations it reproduces; anything else keeps funasr's code."""
    @functools.wraps(original)
    def method(self, *args, **kwargs):  # noqa: ANN001, ANN202
        return (fast if usual(self) else original)(self, *args, **kwargs)

    method.__wrapped_original__ = original
    return method


def apply() -> None:
    """Patch funasr's CTC, LabelSmoothingLoss and every loaded module's ``th_accuracy``. Idempotent."""
    global _applied
    from funasr.losses import label_smoothing_loss
    from funasr.metrics import compute_acc
    from funasr.models.ctc import ctc

    if not _applied:
        replace(ctc.CTC, "forward", _unless_unusual(
            ctc_forward, ctc.CTC.forward, lambda m: m.ctc_type == "builtin" and m.ctc_lo is not None))
        cls = label_smoothing_loss.LabelSmoothingLoss
        replace(cls, "forward", _unless_unusual(
            label_smoothing_forward, cls.forward,
            lambda m: isinstance(m.criterion, torch.nn.KLDivLoss) and m.criterion.reduction == "none"))
        _applied = True
        log.info("funasr's CTC, label-smoothing and accuracy computed in fewer passes "
                 "(funasr_recipe/compat/fused_losses.py)")
    # The models import th_accuracy by name: replace it where it is defined (for modules imported
    # later) and in every funasr module that already holds it.
    original = getattr(compute_acc.th_accuracy, "__wrapped_original__", compute_acc.th_accuracy)
    th_accuracy.__wrapped_original__ = original
    for name, module in list(sys.modules.items()):
        if name.startswith("funasr.") and getattr(module, "th_accuracy", None) is original:
            copy = None if module is compute_acc else ACCURACY  # the others imported it by name
            replace(module, "th_accuracy", th_accuracy, copy_of=copy)
