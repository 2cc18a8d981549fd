"""Training curves from funasr's training log: loss, learning rate, throughput, data wait, accuracy;
during or after training.

Reads  exp/<tag>/train.log (the trainer's log lines, as run.sh tees them; rank 0's lines are used:
funasr's own train/validate lines and, where the recipe's trainer hook wrote them, its
``train_metrics: {json}`` lines);
writes <out>.png (train loss per logged step with validation loss per epoch, learning rate,
utterances/s and frames/s of rank 0, data-wait fraction, accuracy) and <out>.tsv (the parsed points),
so a run can be watched while it trains and compared afterwards. Older logs without train_metrics
lines still plot; their throughput and data-wait panels say "not logged".

  plot(parse_log(Path("exp/tiny_sensevoice/train.log")), Path("exp/tiny_sensevoice/curves"), "title")
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from funasr_recipe.core.rejections import BadInputError

if TYPE_CHECKING:
    from matplotlib.axes import Axes

log = logging.getLogger(__name__)

# funasr 1.4.16 trainer_ds.Trainer.log and train_ds.main, e.g.
#   train, rank: 0, epoch: 1/2, ... total step: 40, (loss_avg_rank: 41.498), ... (acc_avg_slice: 0.000),
#   (lr: 2.733e-04), [('loss_ctc', 34.031), ('acc_rich', 0.0)], ...
#   Validate epoch: 2, rank: 0      ...      current_val: 43.627, best_val_loss: 67.25
# An epoch that does not improve logs no current_val but "No improvement in loss: 4.3196 > 4.0236".
NUM = r"([-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|nan|inf)"
TRAIN = re.compile(rf"train, rank: 0, epoch: (\d+)/\d+, .*?total step: (\d+), \(loss_avg_rank: {NUM}\), "
                   rf".*?\(acc_avg_slice: {NUM}\), \(lr: {NUM}\), \[(.*?)\]")
STAT = re.compile(rf"\('(\w+)', {NUM}\)")
VALIDATE = re.compile(r"Validate epoch: (\d+), rank: 0\b")
VAL_LOSS = re.compile(rf"\[node\d+ rank0\].*(?:current_val: |No improvement in loss: ){NUM}")
# The recipe's trainer hook, global rank 0 only, right after funasr's train line of the same step:
#   ... [node0 rank0] [metrics.py:123] train_metrics: {"step": 40, "epoch": 1, "loss": 41.5, ...}
METRICS = re.compile(r"\[node\d+ rank0\] \[[^\]]*\] train_metrics: (\{.*\})\s*$")
METRIC_KEYS = ("utt_per_s", "frames_per_s", "data_wait", "grad_norm", "allreduce_s")
DATA_WAIT_LIMIT = 0.1

# What funasr's accuracy stats measure (funasr 1.4.16):
# - ``acc`` (transformer, conformer, paraformer, ...): th_accuracy of the attention decoder's tokens
#   against the reference, the decoder fed the reference (teacher-forced; paraformer's non-autoregressive
#   decoder gets the reference through its glancing sampler); it is not 1 - CER of a real decoding.
# - ``acc_rich`` (SenseVoiceSmall.forward -> _calc_rich_ce_loss): th_accuracy of ctc_lo on the 4 leading
#   encoder frames against text[:, :4], the language, emotion, event and ITN tags; the transcript tokens
#   are only in loss_ctc, so acc_rich says nothing about the words.
# - a CTC-only model logs neither, and acc_avg_slice then stays at its initial 0.
ACC_LABELS = {
    "acc": "token accuracy of the attention decoder (acc, teacher-forced, train batches)",
    "acc_rich": "SenseVoice acc_rich: accuracy of the 4 rich tags (language, emotion, event, ITN), "
                "not of the transcript",
}


@dataclass
class Curves:
    step: list[int] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    lr: list[float] = field(default_factory=list)
    acc: list[float] = field(default_factory=list)  # of kind acc_kind; nan where none is logged
    acc_kind: str | None = None  # "acc", "acc_rich", or None (a CTC model logs no accuracy)
    val_epoch: list[int] = field(default_factory=list)
    val_step: list[int] = field(default_factory=list)
    val_loss: list[float] = field(default_factory=list)
    # From train_metrics lines, aligned by metric_step (funasr's total step); nan where logged as null.
    metric_step: list[int] = field(default_factory=list)
    metric_epoch: list[int] = field(default_factory=list)
    utt_per_s: list[float] = field(default_factory=list)
    frames_per_s: list[float] = field(default_factory=list)  # 10 ms input feature frames
    data_wait: list[float] = field(default_factory=list)  # fraction 0..1 of step time
    grad_norm: list[float] = field(default_factory=list)
    allreduce_s: list[float] = field(default_factory=list)


def _num(value: float | None) -> float:
    return float("nan") if value is None else float(value)


def _add_metrics(curves: Curves, text: str) -> None:
    """Append one train_metrics JSON object; raises ValueError/KeyError/TypeError if it is not one."""
    obj = json.loads(text)
    values = [_num(obj.get(k)) for k in METRIC_KEYS]  # before any append: a bad value adds nothing
    curves.metric_step.append(int(obj["step"]))
    curves.metric_epoch.append(int(obj.get("epoch", -1)))
    for key, value in zip(METRIC_KEYS, values, strict=True):
        getattr(curves, key).append(value)


def parse_log(path: Path) -> Curves:
    """Points of rank 0 from a (possibly still growing) funasr training log."""
    curves, epoch, bad = Curves(), None, []
    with open(path, encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, 1):
            if m := TRAIN.search(line):
                stats = {k: float(v) for k, v in STAT.findall(m.group(6))}
                kind = "acc" if "acc" in stats else "acc_rich" if "acc_rich" in stats else None
                curves.acc_kind = curves.acc_kind or kind
                curves.step.append(int(m.group(2)))
                curves.loss.append(float(m.group(3)))
                curves.lr.append(float(m.group(5)))
                curves.acc.append(stats.get(curves.acc_kind or "", float("nan")))
            elif m := METRICS.search(line):
                try:
                    _add_metrics(curves, m.group(1))
                except (ValueError, KeyError, TypeError, AttributeError) as e:
                    bad.append(f"{lineno} ({e.__class__.__name__}: {e})")
            elif m := VALIDATE.search(line):
                epoch = int(m.group(1))
            elif (m := VAL_LOSS.search(line)) and epoch is not None:
                curves.val_epoch.append(epoch)
                curves.val_step.append(curves.step[-1] if curves.step else 0)
                curves.val_loss.append(float(m.group(1)))
                epoch = None
    if bad:
        # A line still being written (the last one of a growing log) lands here too.
        log.warning("%s: %d train_metrics lines not parsed, skipped: line %s", path, len(bad),
                    "; ".join(bad[:5]))
    return curves


def use_log_scale(values: Iterable[float]) -> bool:
    """True when the positive finite values span more than a decade (max/min > 10)."""
    pos = [v for v in values if math.isfinite(v) and v > 0]
    return bool(pos) and max(pos) / min(pos) > 10


def acc_label(kind: str | None) -> str:
    """What the accuracy curve measures, for the panel's title; "" when nothing is logged."""
    return ACC_LABELS.get(kind or "", "")


def _not_logged(ax: Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center",
            color="gray", wrap=True)
    ax.set_yticks([])


def _plot_loss(ax: Axes, c: Curves) -> None:
    ax.plot(c.step, c.loss, label="train (rank 0)", lw=1)
    ax.plot(c.val_step, c.val_loss, "o-", label="validation (epoch end)")
    if use_log_scale(c.loss + c.val_loss):
        ax.set_yscale("log")
    ax.set_ylabel("loss")
    ax.legend()


def _plot_throughput(ax: Axes, c: Curves) -> None:
    if not c.metric_step:
        _not_logged(ax, "throughput not logged (no train_metrics lines in this log)")
        return
    lines = ax.plot(c.metric_step, c.utt_per_s, color="C0", label="utterances/s")
    ax.set_ylabel("utt/s (rank 0)", color="C0")
    # Frames/s is ~100x utt/s: a second y-axis keeps both readable.
    b = ax.twinx()
    lines += b.plot(c.metric_step, c.frames_per_s, color="C1", label="frames/s (10 ms)")
    b.set_ylabel("frames/s (rank 0)", color="C1")
    ax.legend(lines, [ln.get_label() for ln in lines], loc="upper left", fontsize=8)


def _plot_data_wait(ax: Axes, c: Curves) -> None:
    ax.set_ylabel("data-wait fraction")
    if not c.metric_step:
        _not_logged(ax, "data wait not logged (no train_metrics lines in this log)")
        return
    ax.plot(c.metric_step, c.data_wait, color="C2")
    ax.axhline(DATA_WAIT_LIMIT, ls="--", color="C3")
    ax.text(0.99, DATA_WAIT_LIMIT + 0.03, f"{DATA_WAIT_LIMIT}: above this the loader starves the GPU",
            color="C3", transform=ax.get_yaxis_transform(), ha="right", fontsize=8,
            bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8})
    ax.set_ylim(0, 1)


def _plot_acc(ax: Axes, c: Curves) -> None:
    ax.set_ylabel("accuracy (train)")
    if c.acc_kind is None:
        _not_logged(ax, "no accuracy: the model logs none (a CTC model has no accuracy)"
                    if c.step else "no training lines yet")
        return
    ax.plot(c.step, c.acc)
    ax.set_title(acc_label(c.acc_kind), fontsize=9)


def _cell(value: float | None) -> str:
    return "" if value is None or math.isnan(value) else str(value)


def write_tsv(c: Curves, path: Path) -> None:
    """Write one row per train step (with its train_metrics where logged at that step), one per
    train_metrics step without a funasr train line, one per validation."""
    metrics = {s: i for i, s in enumerate(c.metric_step)}

    def metric_cells(i: int | None) -> str:
        return "\t".join(_cell(None if i is None else getattr(c, k)[i]) for k in METRIC_KEYS)

    with open(path, "w", encoding="utf-8") as f:
        f.write("\t".join(("kind", "step", "epoch", "loss", "lr", c.acc_kind or "acc") + METRIC_KEYS) + "\n")
        for s, loss, lr, acc in zip(c.step, c.loss, c.lr, c.acc, strict=True):
            f.write(f"train\t{s}\t\t{loss}\t{lr}\t{_cell(acc)}\t{metric_cells(metrics.pop(s, None))}\n")
        for s, i in metrics.items():
            f.write(f"metrics\t{s}\t{c.metric_epoch[i]}\t\t\t\t{metric_cells(i)}\n")
        for s, e, loss in zip(c.val_step, c.val_epoch, c.val_loss, strict=True):
            f.write(f"valid\t{s}\t{e}\t{loss}\t\t\t{metric_cells(None)}\n")


def read_validation_losses(path: Path) -> list[float]:
    """The validation loss after each epoch, in order, from a curves.tsv that ``write_tsv`` wrote (the
    benchmarks that compare runs read it). Raises ValueError naming the file and line when it is not one,
    or holds no validation row."""
    with open(path, encoding="utf-8", newline="") as f:
        header = f.readline().rstrip("\n").split("\t")
        if header[:5] != ["kind", "step", "epoch", "loss", "lr"]:
            raise BadInputError(f"{path}:1: not a curves.tsv (header {header[:5]})")
        losses = []
        for lineno, line in enumerate(f, start=2):
            cells = line.rstrip("\n").split("\t")
            if cells[0] != "valid":
                continue
            try:
                losses.append(float(cells[3]))
            except (IndexError, ValueError):
                raise BadInputError(f"{path}:{lineno}: validation row without a loss: "
                                    f"{line.strip()!r}") from None
    if not losses:
        raise BadInputError(f"{path}: no validation row (did training finish an epoch?)")
    return losses


def plot(curves: Curves, out: Path, title: str) -> None:
    """Write ``out``.png (five panels) and ``out``.tsv."""
    import matplotlib

    matplotlib.use("Agg")  # files only: works on a node without a display
    import matplotlib.pyplot as plt

    out.parent.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(5, 1, figsize=(9, 14), sharex=True)
    _plot_loss(axes[0], curves)
    axes[1].plot(curves.step, curves.lr)
    axes[1].set_ylabel("learning rate")
    _plot_throughput(axes[2], curves)
    _plot_data_wait(axes[3], curves)
    _plot_acc(axes[4], curves)
    axes[4].set_xlabel("optimizer step (funasr total step)")
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=100)
    plt.close(fig)
    write_tsv(curves, out.with_suffix(".tsv"))
