"""local/plot_training.py on log lines in funasr 1.4.16's exact format (copied from a real run), and the
recipe's train_metrics lines in the trainer hook's exact format."""

from __future__ import annotations

import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # tests write files only; no display on CI or nodes

import pytest  # noqa: E402

from funasr_recipe.reports.curves import (  # noqa: E402
    acc_label,
    parse_log,
    plot,
    read_validation_losses,
    use_log_scale,
)
from local.plot_training import main  # noqa: E402

TRAIN = ("2026-11-30 15:53:58,776 INFO [node0 rank{r}] [trainer_ds.py:953] train, rank: {r}, epoch: {e}/3, "
         "data_slice: 0/1, step_in_slice: {s}/25, step_in_epoch: {s}, total step: {t}, "
         "(loss_avg_rank: {loss}), (loss_avg_slice: 93.657), (ppl_avg_slice: 4.726e+40), "
         "(acc_avg_slice: 0.000), (lr: {lr:.3e}), "
         "[('loss_ctc', 49.982), ('loss_rich', 8.776), ('loss', {loss}), ('acc_rich', {acc})], "
         "{{'data_load': '0.140', 'forward_time': '5.919', 'backward_time': '2.506', 'optim_time': '0.283', "
         "'total_time': '8.849'}}, GPU, memory: usage: 0.000 GB, peak: 0.000 GB, cache: 0.000 GB, "
         "cache_peak: 0.000 GB\n")
VALIDATE = "2026-11-30 15:55:54,189 INFO [node0 rank{r}] [trainer_ds.py:829] Validate epoch: {e}, rank: {r}\n"
CURRENT = ("2026-11-30 15:56:01,920 INFO [node0 rank{r}] [train_ds.py:261] current_val: {v}, "
           "best_val_loss: inf\n")
NO_BETTER = ("2026-11-30 16:52:08,891 INFO [node0 rank{r}] [train_ds.py:266] No val_loss improvement "
             "for 1/0 epochs\n"
             "2026-11-30 16:52:08,895 INFO [node0 rank{r}] [trainer_ds.py:273] No improvement in loss: "
             "{v:.4f} > 4.0236, /x/exp/model.pt.ep2\n")


def write_log(path: Path, epochs: int, partial: bool = False) -> list[float]:
    vals, lines, total = [], [], 0
    for e in range(epochs):
        for s in (10, 20):
            total += 10
            for r in (1, 0):  # rank 1's lines come first and must be ignored
                lines.append(TRAIN.format(r=r, e=e, s=s, t=total, loss=90.0 - total - r, lr=1e-4 * total,
                                          acc=0.01 * total))
        if partial and e == epochs - 1:
            break  # still training: no validation yet for the last epoch
        vals.append(60.0 - 10 * e if e != 1 else 75.0)  # epoch 2 does not improve
        for r in (0, 1):
            lines.append(VALIDATE.format(r=r, e=e + 1))
        for r in (1, 0):
            lines.append((NO_BETTER if e == 1 else CURRENT).format(r=r, v=vals[-1] + r))
    path.write_text("".join(lines))
    return vals


def test_parse_rank0_points_and_validation(tmp_path: Path) -> None:
    vals = write_log(tmp_path / "train.log", 3)
    c = parse_log(tmp_path / "train.log")
    assert c.step == [10, 20, 30, 40, 50, 60]
    assert c.loss == [90.0 - s for s in c.step]  # rank 0's values, not rank 1's
    assert c.lr == [round(1e-4 * s, 7) for s in c.step] and c.acc == [0.01 * s for s in c.step]
    assert c.val_loss == vals and c.val_epoch == [1, 2, 3] and c.val_step == [20, 40, 60]


def test_plots_a_log_that_is_still_growing(tmp_path: Path) -> None:
    write_log(tmp_path / "train.log", 2, partial=True)
    assert main([str(tmp_path / "train.log"), "--out", str(tmp_path / "curves")]) == 0
    assert (tmp_path / "curves.png").stat().st_size > 10_000
    rows = (tmp_path / "curves.tsv").read_text().splitlines()
    assert rows[0].startswith("kind\tstep") and sum(r.startswith("train") for r in rows) == 4
    assert sum(r.startswith("valid") for r in rows) == 1


def test_validation_only_log_still_plots(tmp_path: Path) -> None:
    """A short run whose log_interval exceeds its steps has validation lines only."""
    (tmp_path / "train.log").write_text(VALIDATE.format(r=0, e=1) + CURRENT.format(r=0, v=3.5))
    assert main([str(tmp_path / "train.log")]) == 0
    assert parse_log(tmp_path / "train.log").val_loss == [3.5] and (tmp_path / "curves.png").is_file()


def test_empty_or_missing_log_fails_clearly(tmp_path: Path) -> None:
    assert main([str(tmp_path / "nothing.log")]) == 2
    (tmp_path / "train.log").write_text("starting\n")
    assert main([str(tmp_path / "train.log")]) == 2


METRICS = "2026-12-01 11:19:03,731 INFO [node0 rank{r}] [metrics.py:123] train_metrics: {obj}\n"
CTC_TRAIN = ("2026-11-30 15:53:58,776 INFO [node0 rank0] [trainer_ds.py:953] train, rank: 0, epoch: 0/3, "
             "data_slice: 0/1, step_in_slice: {t}/25, step_in_epoch: {t}, total step: {t}, "
             "(loss_avg_rank: {loss}), (loss_avg_slice: 93.657), (ppl_avg_slice: 4.726e+40), "
             "(acc_avg_slice: 0.000), (lr: 1.000e-04), [{stats}], {{'data_load': '0.140'}}, GPU, memory: "
             "usage: 0.000 GB, peak: 0.000 GB, cache: 0.000 GB, cache_peak: 0.000 GB\n")


def metrics_obj(step: int, grad_norm: float | None = 3.2) -> str:
    return json.dumps({"step": step, "epoch": 1, "loss": 41.5, "lr": 0.000273, "utt_per_s": 80.0 + step,
                       "frames_per_s": 6000.0 + step, "data_wait": step / 1000, "grad_norm": grad_norm,
                       "allreduce_s": 0.0021})


def write_log_with_metrics(path: Path) -> None:
    """Two epochs of funasr train lines, each followed by the hook's line of the same step; rank 1's
    lines (which the hook never writes, but a stray one must not count) come first."""
    write_log(path, 2)
    lines = []
    for line in path.read_text().splitlines(keepends=True):
        lines.append(line)
        if "train, rank: 0," in line:
            step = int(line.split("total step: ")[1].split(",")[0])
            lines.append(METRICS.format(r=1, obj=metrics_obj(999)))
            lines.append(METRICS.format(r=0, obj=metrics_obj(step, None if step == 20 else 3.2)))
    lines.append(METRICS.format(r=0, obj='{"step": 50, "utt_per_s": 8'))  # still being written
    path.write_text("".join(lines))


def test_parse_train_metrics_lines(tmp_path: Path) -> None:
    write_log_with_metrics(tmp_path / "train.log")
    c = parse_log(tmp_path / "train.log")
    assert c.step == [10, 20, 30, 40] and c.metric_step == [10, 20, 30, 40]
    assert c.metric_epoch == [1] * 4 and c.utt_per_s == [80.0 + s for s in c.step]
    assert c.frames_per_s == [6000.0 + s for s in c.step] and c.data_wait == [s / 1000 for s in c.step]
    assert c.allreduce_s == [0.0021] * 4
    assert c.grad_norm[0] == 3.2 and math.isnan(c.grad_norm[1])  # null: unknown
    assert c.val_loss == [60.0, 75.0] and c.acc_kind == "acc_rich"


def test_plot_with_metrics_writes_png_and_tsv_columns(tmp_path: Path) -> None:
    write_log_with_metrics(tmp_path / "train.log")
    assert main([str(tmp_path / "train.log"), "--out", str(tmp_path / "curves")]) == 0
    assert (tmp_path / "curves.png").stat().st_size > 10_000
    rows = [r.split("\t") for r in (tmp_path / "curves.tsv").read_text().splitlines()]
    head = rows[0]
    assert head == ["kind", "step", "epoch", "loss", "lr", "acc_rich", "utt_per_s", "frames_per_s",
                    "data_wait", "grad_norm", "allreduce_s"]
    train = [dict(zip(head, r, strict=True)) for r in rows[1:] if r[0] == "train"]
    assert [float(r["utt_per_s"]) for r in train] == [90.0, 100.0, 110.0, 120.0]
    assert train[1]["grad_norm"] == "" and float(train[0]["grad_norm"]) == 3.2
    assert sum(r[0] == "valid" for r in rows) == 2 and not any(r[0] == "metrics" for r in rows)


def test_validation_losses_read_back_from_the_tsv_written(tmp_path: Path) -> None:
    write_log_with_metrics(tmp_path / "train.log")
    assert main([str(tmp_path / "train.log"), "--out", str(tmp_path / "curves")]) == 0
    assert read_validation_losses(tmp_path / "curves.tsv") == parse_log(tmp_path / "train.log").val_loss


def test_validation_losses_are_the_valid_rows_in_order(tmp_path: Path) -> None:
    tsv = tmp_path / "curves.tsv"
    tsv.write_text("kind\tstep\tepoch\tloss\tlr\n"
                   "train\t10\t\t99.1\t0.001\n"
                   "valid\t40\t1\t19.85\t\n"
                   "train\t50\t\t3.2\t0.002\n"
                   "valid\t87\t2\t2.88\t\n")
    assert read_validation_losses(tsv) == [19.85, 2.88]


@pytest.mark.parametrize(("text", "message"), [
    ("", r"curves.tsv:1: not a curves.tsv"),
    ("kind\tstep\tepoch\tloss\tlr\ntrain\t10\t\t99.1\t0.001\n", r"curves.tsv: no validation row"),
    ("kind\tstep\tepoch\tloss\tlr\nvalid\t40\t1\tx\t\n", r"curves.tsv:2: validation row without a loss"),
    ("kind\tstep\tepoch\tloss\tlr\nvalid\t40\n", r"curves.tsv:2: validation row without a loss"),
], ids=["empty", "no-valid-row", "not-a-number", "cut-short"])
def test_a_bad_curves_tsv_is_named(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "curves.tsv").write_text(text)
    with pytest.raises(ValueError, match=message):
        read_validation_losses(tmp_path / "curves.tsv")


def test_a_missing_curves_tsv_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="curves.tsv"):
        read_validation_losses(tmp_path / "curves.tsv")


def test_old_format_log_has_no_metrics_and_still_plots(tmp_path: Path) -> None:
    write_log(tmp_path / "train.log", 2)
    c = parse_log(tmp_path / "train.log")
    assert c.step and not c.metric_step and not c.utt_per_s
    plot(c, tmp_path / "curves", "old log")
    assert (tmp_path / "curves.png").stat().st_size > 10_000
    rows = (tmp_path / "curves.tsv").read_text().splitlines()
    assert rows[0].endswith("allreduce_s") and rows[1].endswith("\t\t\t\t")  # metric cells empty


def test_log_scale_decision() -> None:
    assert use_log_scale([300.0, 120.0, 40.0, 9.0, 2.0])  # 150x: linear would hide the tail
    assert not use_log_scale([5.0, 4.2, 3.0])
    assert not use_log_scale([]) and not use_log_scale([float("nan"), 0.0, -1.0])
    assert not use_log_scale([0.0, 5.0, 3.0, float("inf")])  # only positive finite values count


def test_accuracy_label_says_what_is_measured(tmp_path: Path) -> None:
    assert acc_label("acc") != acc_label("acc_rich")
    assert "teacher-forced" in acc_label("acc") and "decoder" in acc_label("acc")
    assert all(w in acc_label("acc_rich") for w in ("language", "emotion", "event", "ITN"))
    assert acc_label(None) == ""
    # Which one a log has is read from the stats list of funasr's train line.
    (tmp_path / "att.log").write_text(CTC_TRAIN.format(t=10, loss=5.0, stats="('loss', 5.0), ('acc', 0.42)"))
    assert parse_log(tmp_path / "att.log").acc_kind == "acc" and parse_log(tmp_path / "att.log").acc == [0.42]


def test_ctc_model_has_no_accuracy(tmp_path: Path) -> None:
    (tmp_path / "train.log").write_text("".join(CTC_TRAIN.format(t=t, loss=300.0 / t, stats="('loss', 1.0)")
                                                for t in (1, 50, 150)))
    c = parse_log(tmp_path / "train.log")
    assert c.acc_kind is None and all(math.isnan(a) for a in c.acc)  # not acc_avg_slice's stuck 0
    assert use_log_scale(c.loss)
    assert main([str(tmp_path / "train.log")]) == 0 and (tmp_path / "curves.png").is_file()
