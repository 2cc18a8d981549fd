"""Training curves from funasr's training log: loss, learning rate, accuracy; during or after training.

Reads  exp/<tag>/train.log (the trainer's log lines, as run.sh tees them; rank 0's lines are used);
writes <out>.png (train loss per logged step with validation loss per epoch, learning rate, accuracy)
and <out>.tsv (the parsed points), so a run can be watched while it trains and compared afterwards.

  plot(parse_log(Path("exp/tiny_sensevoice/train.log")), Path("exp/tiny_sensevoice/curves"), "title")
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

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


@dataclass
class Curves:
    step: list[int] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    lr: list[float] = field(default_factory=list)
    acc: list[float] = field(default_factory=list)  # funasr's acc, or SenseVoice's acc_rich
    val_epoch: list[int] = field(default_factory=list)
    val_step: list[int] = field(default_factory=list)
    val_loss: list[float] = field(default_factory=list)


def parse_log(path: Path) -> Curves:
    """Points of rank 0 from a (possibly still growing) funasr training log."""
    curves, epoch = Curves(), None
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if m := TRAIN.search(line):
                stats = {k: float(v) for k, v in STAT.findall(m.group(6))}
                curves.step.append(int(m.group(2)))
                curves.loss.append(float(m.group(3)))
                curves.lr.append(float(m.group(5)))
                curves.acc.append(stats.get("acc", stats.get("acc_rich", float(m.group(4)))))
            elif m := VALIDATE.search(line):
                epoch = int(m.group(1))
            elif (m := VAL_LOSS.search(line)) and epoch is not None:
                curves.val_epoch.append(epoch)
                curves.val_step.append(curves.step[-1] if curves.step else 0)
                curves.val_loss.append(float(m.group(1)))
                epoch = None
    return curves


def plot(curves: Curves, out: Path, title: str) -> None:
    """Write ``out``.png (three panels) and ``out``.tsv."""
    import matplotlib

    matplotlib.use("Agg")  # files only: works on a node without a display
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(8, 9), sharex=True)
    axes[0].plot(curves.step, curves.loss, label="train (rank 0)", lw=1)
    axes[0].plot(curves.val_step, curves.val_loss, "o-", label="validation (epoch end)")
    axes[0].set_ylabel("loss")
    axes[0].legend()
    axes[1].plot(curves.step, curves.lr)
    axes[1].set_ylabel("learning rate")
    axes[2].plot(curves.step, curves.acc)
    axes[2].set_ylabel("accuracy (train)")
    axes[2].set_xlabel("optimizer step")
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=100)
    plt.close(fig)
    with open(out.with_suffix(".tsv"), "w", encoding="utf-8") as f:
        f.write("kind\tstep\tepoch\tloss\tlr\tacc\n")
        for s, loss, lr, acc in zip(curves.step, curves.loss, curves.lr, curves.acc, strict=True):
            f.write(f"train\t{s}\t\t{loss}\t{lr}\t{acc}\n")
        for s, e, loss in zip(curves.val_step, curves.val_epoch, curves.val_loss, strict=True):
            f.write(f"valid\t{s}\t{e}\t{loss}\t\t\n")
