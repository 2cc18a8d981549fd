"""The divergence guard (funasr_recipe/compat/divergence.py): short CPU trainings (2 ranks, torchrun) with a
NaN injected through FUNASR_RECIPE_FAULT, under DeepSpeed ZeRO-1 bf16 and DDP, whose bad steps are
skipped on every rank; a learning rate of 1e3 that stops with advice; and the pieces as units."""

from __future__ import annotations

import functools
import json
import math
import re
import subprocess
from pathlib import Path

import pytest
import torch

from funasr_recipe.compat.divergence import (
    FAULT_ENV,
    SOURCE,
    LossRule,
    _SaturatingMath,
    carry_sources,
    keys_of,
    parse_faults,
)
from funasr_recipe.model.checkpoint import deepspeed_safe_globals, safe_load
from funasr_recipe.reports.curves import parse_log
from tests.helpers.run_sh import CLEAN_ENV, ROOT, venv_python
from tests.helpers.train_fixtures import free_port

# 10 steps an epoch per rank on the 1200 training utterances of the prepared digits (3000 frames a batch).
TINY = ["++train_conf.log_interval=1", "++dataset_conf.batch_size=3000", "++scheduler_conf.warmup_steps=10"]


def train(prepared: Path, exp: str, *options: str, overrides: tuple[str, ...] = (), env: dict | None = None,
          timeout: float = 600) -> tuple[int, str]:
    """Stage 2's program under torchrun on 2 CPU ranks, as run.sh starts it, without its preflight and
    plots; (exit status, the log of both ranks)."""
    data = ["--data-dir", str(prepared / "data"), "--dump-dir", str(prepared / "dump")]
    cmd = [venv_python(), "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-port", str(free_port()), "-m", "local.train", "--config", "conf/tiny_sensevoice.yaml",
           "--exp-dir", str(prepared / exp), *data, "--train-set", "train", "--valid-set", "dev",
           "--oom-probe", "false", *options, "--", *TINY, *overrides]
    # run.sh's environment for the ranks (path.sh and its DS_ACCELERATOR on CPU).
    ranks_env = {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                 "DS_ACCELERATOR": "cpu", "PYTHONUNBUFFERED": "1", "LC_ALL": "C.UTF-8"}
    env = {**{k: v for k, v in CLEAN_ENV.items() if k != FAULT_ENV}, **ranks_env, **(env or {})}
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)
    log = res.stdout + res.stderr
    (prepared / f"{exp}.log").write_text(log)
    return res.returncode, log


def train_steps(log: str, rank: int) -> list[int]:
    """funasr's logged training steps of one rank."""
    return [int(s) for s in re.findall(rf"\] train, rank: {rank}, .*?total step: (\d+),", log)]


def bad_lines(log: str, step: int) -> dict[int, str]:
    """rank -> its 'bad step' line for this step."""
    return {int(r): line for line in log.splitlines()
            if (m := re.search(rf"\[node0 rank(\d)\] \[divergence.py:\d+\] bad step {step} ", line))
            for r in [m.group(1)]}


def training_keys(prepared: Path) -> set[str]:
    lines = (prepared / "dump" / "train" / "data.jsonl").read_text().splitlines()
    return {json.loads(line)["key"] for line in lines}


def assert_skipped_nan_batch(log: str, prepared: Path, step: int, rank: int) -> None:
    """The injected NaN's step is skipped on both ranks and the bad rank names its batch's keys."""
    injected = re.search(rf"\[node0 rank{rank}\] .*fault injection \({FAULT_ENV}\): NaN in the features of "
                         rf"(\S+), step {step}\b", log)
    assert injected, log[-3000:]
    lines = bad_lines(log, step)
    assert set(lines) == {0, 1}, lines
    for line in lines.values():
        assert f"non-finite loss on rank {rank} (nan); skipped on every rank" in line
    m = re.search(r"This rank's batch \((\d+) utterances\): (.*?); non-finite features in (\S+)$",
                  lines[rank])
    assert m, lines[rank]
    keys = m.group(2).split()
    assert len(keys) == int(m.group(1)) > 1 and set(keys) <= training_keys(prepared)
    assert m.group(3) == injected.group(1) and injected.group(1) in keys
    assert "batch" not in lines[1 - rank]  # the other rank's batch was fine: it names none


@pytest.mark.fault_slow
@pytest.mark.fault("a NaN in one batch's features and a NaN gradient later (DeepSpeed ZeRO-1)")
def test_deepspeed_skips_a_nan_batch_and_a_nan_gradient(prepared: Path, lost) -> None:
    rc, log = train(prepared, "exp_nan_ds", overrides=("++train_conf.max_epoch=1",),
                    env={FAULT_ENV: "nan-input:3:1,nan-grad:6"})
    assert rc == 0, log[-4000:]
    assert "Traceback" not in log
    assert_skipped_nan_batch(log, prepared, step=3, rank=1)
    # A finite loss whose gradient is NaN: ZeRO's overflow check in engine.step() skipped the update.
    grad = bad_lines(log, 6)
    assert set(grad) == {0, 1} and all("non-finite gradient (DeepSpeed skipped the update)" in line and
                                       "This rank's batch" in line for line in grad.values())
    for rank in (0, 1):  # funasr's log line of a skipped step is not written; every other step's is
        assert train_steps(log, rank) == [1, 2, 4, 5, 7, 8, 9, 10]
    curves = parse_log(prepared / "exp_nan_ds.log")
    assert all(math.isfinite(x) for x in curves.loss) and math.isfinite(curves.val_loss[-1])
    # Neither skipped step advanced the linear warmup (funasr logs the next step's learning rate).
    lr = dict(zip(curves.step, curves.lr, strict=True))
    assert lr[4] == pytest.approx(lr[2] + (lr[2] - lr[1])) and lr[7] == pytest.approx(lr[5] + (lr[2] - lr[1]))
    # DeepSpeed's bookkeeping: the batch skipped before backward is no step at all; the overflow is one
    # step, counted as skipped (10 batches: 9 steps, 1 skipped).
    with torch.serialization.safe_globals(deepspeed_safe_globals()):  # weights only, as stage 3 loads
        states = safe_load(next((prepared / "exp_nan_ds").rglob("mp_rank_00_model_states.pt")))
    assert (states["global_steps"], states["skipped_steps"]) == (9, 1)
    lost("2 of 10 steps, skipped on both ranks with the batch's keys logged; the run finished, losses finite")


@pytest.mark.fault_slow
@pytest.mark.fault("a NaN in one batch's features and a NaN gradient later (DDP)")
def test_ddp_skips_a_nan_batch_and_a_nan_gradient(prepared: Path, lost) -> None:
    rc, log = train(prepared, "exp_nan_ddp", "--train-engine", "ddp", overrides=("++train_conf.max_epoch=1",),
                    env={FAULT_ENV: "nan-input:3:1,nan-grad:6:0"})
    assert rc == 0, log[-4000:]
    assert "use_ddp: True" in log and "Traceback" not in log
    assert_skipped_nan_batch(log, prepared, step=3, rank=1)
    # NaN only in rank 0's backward: DDP's all-reduce spreads it, both ranks see it before the update.
    grad = bad_lines(log, 6)
    assert set(grad) == {0, 1} and all("non-finite gradient norm nan" in line for line in grad.values())
    assert "The grad norm is" not in log  # funasr's own check never saw it
    for rank in (0, 1):
        assert train_steps(log, rank) == [1, 2, 4, 5, 7, 8, 9, 10]
    curves = parse_log(prepared / "exp_nan_ddp.log")
    assert all(math.isfinite(x) for x in curves.loss) and math.isfinite(curves.val_loss[-1])
    lost("2 of 10 steps, skipped on both ranks with the batch's keys logged; the run finished, losses finite")


@pytest.mark.fault_slow
@pytest.mark.fault("a learning rate of 1e3 (divergence)")
def test_learning_rate_1e3_stops_with_advice(prepared: Path, lost) -> None:
    rc, log = train(prepared, "exp_lr1e3", "--max-bad-steps", "5",
                    overrides=("++train_conf.max_epoch=3", "++optim_conf.lr=1e3"))
    assert rc != 0
    assert "OverflowError" not in log and "math range error" not in log
    # Step 1 has no reference; its update wrecks the weights, and steps 2-6 explode (loss near 1e6).
    for step in range(2, 7):
        assert set(bad_lines(log, step)) == {0, 1}, step
    for rank in (0, 1):
        assert re.search(rf"\[node0 rank{rank}\] \[divergence.py:\d+\] training diverged: 5 bad steps in a "
                         r"row, the last step 6 \(loss over [\d.e+]+ \(10 x the median", log), rank
    advice = re.search(r"ERROR .*training diverged: .*$", log, re.M).group(0)
    assert "++optim_conf.lr=100 (now 1000)" in advice
    assert "++scheduler_conf.warmup_steps=20 (now 10)" in advice
    assert "'bad step' lines above" in advice
    assert "Train epoch: 1" not in log  # well before the end: 6 of its 30 steps
    lost("the run, on purpose: stopped at step 6 of 30 after 5 bad steps in a row, with the advice "
         "(++optim_conf.lr=100, a longer warmup) and no OverflowError")
    assert train_steps(log, 0) == [1]


def test_loss_rule_median_of_accepted_steps_only() -> None:
    rule = LossRule()
    assert rule.bad_ranks([80.0, math.nan]) == [1] and rule.bad_ranks([1e9, 1e9]) == []  # no reference yet
    rule.accept([80.0, 100.0])
    assert rule.limit() == 900.0
    assert rule.bad_ranks([899.0, 901.0, math.inf]) == [1, 2]
    for _ in range(10):  # the bad steps are not accepted: the bar stays where the healthy run put it
        rule.bad_ranks([1e6, 1e6])
    assert rule.limit() == 900.0
    text = rule.describe([math.nan, 1e6, 50.0] + [1e6] * 10, [0, 1, *range(3, 13)])
    assert text.startswith("non-finite loss on rank 0 (nan); loss over 900 (10 x the median of the last "
                           "1 accepted steps, at least 1) on rank 1 (1e+06), 3 (1e+06)")
    assert text.endswith("and 3 more")
    small = LossRule()
    small.accept([0.05])
    assert small.limit() == 10.0  # the floor: a trained model's hard batch is not an explosion
    assert small.bad_ranks([0.9, 11.0]) == [1]


def test_faults_parse_and_bad_values_fail() -> None:
    assert [(f.kind, f.step, f.rank) for f in parse_faults("nan-input:3:1, nan-grad:6")] == [
        ("nan-input", 3, 1), ("nan-grad", 6, None)]
    assert parse_faults("") == []
    for bad in ("nan:3", "nan-input", "nan-input:x", "nan-grad:1:2:3"):
        with pytest.raises(ValueError, match="kind:step"):
            parse_faults(bad)


def test_funasr_perplexity_saturates_instead_of_raising() -> None:
    safe = _SaturatingMath()
    assert safe.exp(1000.0) == math.inf and safe.exp(1.0) == math.e and math.isnan(safe.exp(math.nan))
    assert safe.log(math.e) == 1.0  # the rest of math as it is


class _Set(torch.utils.data.Dataset):
    """funasr's dataset interface as the guard uses it: an index of items with a source each."""

    def __init__(self) -> None:
        self.index_ds = [{"source": f"a.ark:{i}"} for i in range(6)]

    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int) -> dict:
        return {"speech": torch.full((i + 1, 2), float(i)), "speech_lengths": torch.tensor([i + 1])}


def test_batches_carry_sources_through_funasrs_collator_and_workers(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from funasr.datasets.audio_datasets.datasets import AudioDataset

    dataset = _Set()
    assert carry_sources(dataset) and carry_sources(dataset)  # once
    collate = functools.partial(AudioDataset.collator, SimpleNamespace(int_pad_value=-1, float_pad_value=0.0))
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=[[4, 1], [0, 2, 5]], collate_fn=collate,
                                         num_workers=1)
    batches = list(loader)
    assert [b[SOURCE] for b in batches] == [["a.ark:4", "a.ark:1"], ["a.ark:0", "a.ark:2", "a.ark:5"]]
    assert batches[0]["speech"].shape == (2, 5, 2)
    jsonl = tmp_path / "data.jsonl"
    jsonl.write_text("".join(json.dumps({"key": f"utt{i}", "source": f"a.ark:{i}"}) + "\n" for i in range(6)))
    assert keys_of(str(jsonl), ["a.ark:5", "a.ark:0", "b.ark:0"]) == ["utt5", "utt0", "b.ark:0"]
    assert keys_of(None, ["a.ark:5"]) == ["a.ark:5"]
