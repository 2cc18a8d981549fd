"""Stage 2 on CPU is reproducible: two 20-step trainings with the same seed (funasr's default, 0) log the
same losses, every rank and every step, and end with the same weights bit for bit; a third over funasr's
own IndexDSJsonl in place of the configs' IndexDSJsonlMmap logs the same losses."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from funasr_recipe.model.checkpoint import deepspeed_safe_globals, safe_load
from tests.faults.test_divergence import train
from tests.helpers.run_sh import ROOT
from tests.helpers.zero_runs import EPOCHS, extensions_env

ZERO1 = "ds_stage1_bf16"

# funasr's train line of each step and rank, e.g. "train, rank: 1, ... total step: 7, (loss_avg_rank:
# 84.164), (loss_avg_slice: 80.197), ... [('loss_ctc', 76.326), ('loss_rich', 7.839), ...]"; and the
# hooks' train_metrics line (rank 0, the loss to 6 digits). The speeds and times around them differ.
TRAIN = re.compile(r"\] train, rank: (\d+), .*?total step: (\d+), (\(loss_avg_rank: .*?\)), "
                   r"(\(loss_avg_slice: .*?\)), .*?(\[\('loss.*?\)\])")
METRICS = re.compile(r'train_metrics: \{"step": (\d+), "epoch": \d+, "loss": ([^,]+),')
VALID = re.compile(r"\] val, rank: (\d+), .*?(\(loss_avg_rank: .*?\))")


def logged_losses(log: str) -> dict[str, list[tuple]]:
    """Each kind by rank and step: the two ranks' lines interleave differently from run to run."""
    def by_number(rows: list[tuple]) -> list[tuple]:
        return sorted(rows, key=lambda row: tuple(int(x) for x in row if x.isdigit()))

    return {"train": by_number(TRAIN.findall(log)), "metrics": by_number(METRICS.findall(log)),
            "valid": by_number(VALID.findall(log))}


def tensors(obj: object, path: str = "") -> dict[str, torch.Tensor]:
    """Every tensor in a loaded checkpoint by where it sits (its other entries hold the run's paths)."""
    if isinstance(obj, torch.Tensor):
        return {path: obj}
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list | tuple) else ()
    return {k: v for key, value in items for k, v in tensors(value, f"{path}/{key}").items()}


def checkpoint(exp: Path) -> dict[str, torch.Tensor]:
    """The bf16 weights and every rank's fp32 master partition and Adam moments after the last epoch."""
    out = {}
    for file in sorted((exp / "model.pt.ep2").glob("*.pt")):
        with torch.serialization.safe_globals(deepspeed_safe_globals()):  # weights only, as stage 3 loads
            out |= tensors(safe_load(file), file.name)
    return out


@pytest.mark.fault_slow
@pytest.mark.fault("the same seed twice: the first 20 steps on CPU")
def test_twenty_steps_twice_give_the_same_losses(prepared: Path, zero_runs, lost) -> None:
    # 2 epochs of 10 steps per rank (the validation and checkpoint between them are part of the run). The
    # first run is the session's ZeRO-1 run, which the ZeRO tests compare the other stages with.
    first_run = zero_runs(ZERO1)
    rc, log = train(prepared, "exp_det_b", "--ds-config", str(ROOT / "ds_configs" / f"{ZERO1}.json"),
                    overrides=EPOCHS, env=extensions_env())
    assert rc == 0, log[-4000:]
    first, second = logged_losses(first_run.first), logged_losses(log)
    assert sorted((int(r), int(s)) for r, s, *_ in first["train"]) == [(r, s) for r in (0, 1)
                                                                       for s in range(1, 21)]
    assert [int(s) for s, _ in first["metrics"]] == list(range(1, 21)) and len(first["valid"]) >= 4
    for kind in first:
        assert first[kind] == second[kind], kind
    a, b = checkpoint(first_run.exp), checkpoint(prepared / "exp_det_b")
    assert len(a) > 72 and a.keys() == b.keys()
    assert [k for k in a if not torch.equal(a[k], b[k])] == []
    # The configs' mapped index (data/index_ds.py) trains on exactly what funasr's own index gives.
    assert "IndexDSJsonlMmap: " in log
    rc, log = train(prepared, "exp_det_funasr_index", overrides=("++train_conf.max_epoch=2",
                                                                 "++dataset_conf.index_ds=IndexDSJsonl"))
    assert rc == 0, log[-4000:]
    assert "IndexDSJsonlMmap: " not in log
    assert logged_losses(log) == first
    lost("nothing differs: 20 steps x 2 ranks of logged losses identical, every checkpoint tensor equal, "
         "and the same losses over funasr's own IndexDSJsonl")
