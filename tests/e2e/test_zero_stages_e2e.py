"""Every DeepSpeed config of ds_configs/ trains, resumes and is averaged on CPU (2 ranks, gloo): ZeRO-1, 2 and
3 in bf16, ZeRO-3 with the optimizer and the weights offloaded to CPU memory, and ZeRO-1 in fp16 where
DeepSpeed's CPU accelerator has fp16 (skipped, saying why, where it has not).

The runs (tests/helpers/zero_runs.py, one per config for the session): the same 20 steps of the tiny
SenseVoice from scratch; the ZeRO-3 runs are killed (SIGKILL of rank 1 while it writes its partition of
model.pt) and resumed (ZeRO-1's kill and resume are tests/faults/test_checkpoint_io.py's and
tests/e2e/test_train_e2e.py's; ZeRO-2 and fp16 write ZeRO-1's layout, one model-states file and a
partition of the optimizer per rank); stage 3's averaging (fp32, from the shards, with its validation
check) then runs on each. The rest of stages 2-5 under a partitioned config (LoRA merged into the
weights, ONNX export and its parity, the regression gate) is tests/e2e/test_finetune_e2e.py's
fine-tune, which trains with ds_stage3_offload_bf16.json; ZeRO-1's is the session's ``trained`` run.

  .venv/bin/python -m pytest -p no:cacheprovider -q tests/e2e/test_zero_stages_e2e.py
"""

from __future__ import annotations

import re

import pytest
import torch

from funasr_recipe.model.checkpoint import client_state_file, fp32_state_dict, safe_load
from tests.helpers.zero_runs import CONFIGS, KILLED

# funasr's train line: rank, step and the rank's own loss of that step (3 decimals).
STEP_LOSS = re.compile(r"\] train, rank: (\d+), .*?total step: (\d+), .*?\('loss', ([-\d.e+]+)\)")
# The bf16 configs, whose losses must agree (fp16's loss scaler skips the first steps by design).
COMPARED = ("ds_stage1_bf16", "ds_stage2_bf16", "ds_stage3_bf16", "ds_stage3_offload_bf16")
# How far apart the configs' losses may drift in 20 steps: bf16 keeps 8 bits of mantissa (a relative
# rounding of 2^-8), and ZeRO-3 rounds other sums (its weights are views of flat partitions, its
# gradients reduced in other groups), which training then carries on. Another seed, batch order or
# learning rate moves the losses by far more.
DRIFT = 2.0 ** -7


def step_losses(log: str) -> dict[tuple[int, int], float]:
    return {(int(r), int(s)): float(loss) for r, s, loss in STEP_LOSS.findall(log)}


def test_the_first_twenty_steps_have_the_same_losses_under_zero_1_2_and_3(zero_runs) -> None:
    """Switching ZeRO stage (or offloading) does not change what is learnt: the same data and seed give
    each rank the same loss at each step, to bf16's rounding."""
    runs = {config: step_losses(zero_runs(config).first) for config in COMPARED}
    reference = runs["ds_stage1_bf16"]
    steps = [(r, s) for r in (0, 1) for s in range(1, 21)]
    for config, losses in runs.items():
        assert sorted(losses) == steps, (config, sorted(losses))
        far = {k: (losses[k], reference[k]) for k in steps
               if abs(losses[k] - reference[k]) > DRIFT * abs(reference[k])}
        assert not far, f"{config}: losses beyond bf16 rounding of ZeRO-1's: {far}"
    # ... and the steps did learn: the same check would pass on a run that never updated.
    assert reference[(0, 20)] < 0.5 * reference[(0, 1)], reference


@pytest.mark.parametrize("config", CONFIGS[1:])
def test_stage_3_averages_the_fp32_masters_of_the_shards(zero_runs, config: str) -> None:
    run, zero1 = zero_runs(config), zero_runs("ds_stage1_bf16")
    outcome = run.outcome
    assert outcome is not None and outcome.validation["checked"], outcome
    final = safe_load(run.exp / "final" / "model.pt")
    masters = {name: fp32_state_dict(run.exp, name) for name in outcome.chosen.names}
    if outcome.checkpoint.startswith("model.pt.avg"):
        expected = {k: sum(m[k].double() for m in masters.values()) / len(masters) for k in final}
    else:  # the check preferred the best checkpoint alone
        expected = masters[outcome.checkpoint]
    assert final.keys() == expected.keys()
    assert all(torch.allclose(final[k].double(), expected[k].double(), atol=1e-7, rtol=0) for k in final)
    # The fp32 masters, not the 16-bit copies the module trains in: few weights are 16-bit numbers.
    dtype = torch.float16 if "fp16" in config else torch.bfloat16
    weights = torch.cat([v.flatten() for v in final.values() if v.is_floating_point()])
    assert (weights.to(dtype).float() == weights).float().mean() < 0.1
    if config not in COMPARED:
        return  # fp16 trains otherwise: its loss scaler skips the first steps
    # Every partition gathered in its place: epoch 1 (before any kill) is ZeRO-1's epoch 1 but for the
    # rounding of 10 steps, parameter by parameter (a misplaced half is orthogonal to its place).
    ours, theirs = fp32_state_dict(run.exp, "model.pt.ep1"), fp32_state_dict(zero1.exp, "model.pt.ep1")
    assert ours.keys() == theirs.keys() and len(ours) > 70
    assert all(ours[k].shape == theirs[k].shape for k in ours)
    cosines = {k: float(torch.nn.functional.cosine_similarity(ours[k].flatten(), theirs[k].flatten(), dim=0))
               for k in ours}
    assert min(cosines.values()) > 0.98, sorted(cosines.items(), key=lambda kv: kv[1])[:3]
    flat = [torch.cat([d[k].flatten() for k in ours]) for d in (ours, theirs)]
    assert torch.linalg.vector_norm(flat[0] - flat[1]) < 0.01 * torch.linalg.vector_norm(flat[1])


@pytest.mark.parametrize("config", KILLED)
def test_a_rank_killed_while_writing_its_partition_resumes_from_the_last_whole_checkpoint(
        zero_runs, config: str) -> None:
    run = zero_runs(config)
    half = rf"{run.exp}/\.tmp\.model\.pt/\S*zero_pp_rank_1_mp_rank_00_\S+_states\.pt"
    assert re.search(rf"killing rank 1 with {half} half written", run.first), run.first[-3000:]
    resumed = run.resumed
    assert f"removed {run.exp}/.tmp.model.pt: a checkpoint write that never finished" in resumed
    assert "Checkpoint loaded successfully" in resumed
    assert "Train epoch: 1, rank: 0" in resumed and "Train epoch: 0, rank: 0" not in resumed
    assert sorted(step_losses(resumed)) == [(r, s) for r in (0, 1) for s in range(11, 21)]
    state = safe_load(client_state_file(run.exp / "model.pt"))
    assert state["epoch"] == 2 and sorted(state["saved_ckpts"]) == ["model.pt.ep1", "model.pt.ep2"]
    # ZeRO-3's layout: every rank's partition of the optimizer and of the model states.
    assert sorted(p.name for p in (run.exp / "model.pt").iterdir()) == [
        f"{kind}zero_pp_rank_{r}_mp_rank_00_{what}_states.pt"
        for kind, what in (("bf16_", "optim"), ("", "model")) for r in (0, 1)]


def test_the_memory_plan_names_each_configs_sharding_and_offload(zero_runs) -> None:
    plans = {config: re.search(r"\[node0 rank0\] \[hooks.py:\d+\] memory plan: (.*)", zero_runs(config).first)
             for config in COMPARED}
    assert all(plans.values()), plans
    assert "(ZeRO-1: " in plans["ds_stage1_bf16"].group(1)
    assert "(ZeRO-3: deepspeed estimate_zero3" in plans["ds_stage3_bf16"].group(1)
    offloaded = plans["ds_stage3_offload_bf16"].group(1)
    assert "GiB per GPU" in offloaded and "where offloading moves nothing" in offloaded
    assert "(ZeRO-3, optimizer and parameters offloaded: " in offloaded
    assert "funasr's adamw runs as DeepSpeed's CPU Adam" in zero_runs("ds_stage3_offload_bf16").first
