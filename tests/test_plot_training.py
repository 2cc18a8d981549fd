"""local/plot_training.py on log lines in funasr 1.4.16's exact format (copied from a real run)."""

from __future__ import annotations

from pathlib import Path

from funasr_recipe.reports.curves import parse_log
from local.plot_training import main

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
