"""Stage 2 under each DeepSpeed config of ds_configs/ on the prepared digits, once per session: the runs the
ZeRO tests share (tests/e2e/test_zero_stages_e2e.py; the first run of the determinism fault is ZeRO-1's).

Every run is the same training (tests/faults/test_divergence.py ``train``: local.train under torchrun on 2
CPU ranks, as run.sh starts it; tiny_sensevoice from scratch, funasr's seed 0): 2 epochs of 10 steps per
rank. The partitioned configs (KILLED) have rank 1 SIGKILLed half way through writing its share of model.pt
after epoch 2 (compat/checkpoint_io.py's fault injection: all 20 steps are logged by then), and are then
started again, resuming from epoch 1's checkpoint. Every run but ZeRO-1's (the default, which the session's
``trained`` run takes through stages 2-5) is then averaged as stage 3 averages (model/averaging.py
``finalize``, fp32 from the shards, with the validation check; both epochs) into <exp>/final.

Reads the session's ``prepared`` dir; writes <prepared>/exp_<config>/ and <prepared>/exp_<config>*.log.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from funasr_recipe.model.averaging import Outcome, finalize
from tests.helpers.run_sh import ROOT

CONFIGS = ("ds_stage1_bf16", "ds_stage2_bf16", "ds_stage3_bf16", "ds_stage3_offload_bf16", "ds_stage1_fp16")
KILLED = ("ds_stage3_bf16", "ds_stage3_offload_bf16")
KILL = "model.pt:2:1"  # compat/checkpoint_io.py: rank 1, writing model.pt in epoch 2's save
EPOCHS = ("++train_conf.max_epoch=2",)


@dataclass(frozen=True)
class ZeroRun:
    config: str
    exp: Path
    first: str                # the log of the first start: every step of both epochs
    resumed: str | None       # the log of the start after the kill
    outcome: Outcome | None   # stage 3's averaging


def fp16_unsupported() -> str | None:
    """Why DeepSpeed's CPU accelerator refuses fp16 here (it asks oneDNN, which needs AVX512-FP16 or
    AMX-FP16), or None where it trains."""
    from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator

    if CPU_Accelerator().is_fp16_supported():
        return None
    return ("DeepSpeed's CPU accelerator has no fp16 on this CPU (oneDNN fp16 needs AVX512-FP16 or "
            "AMX-FP16): DeepSpeed stops with 'Type fp16 is not supported on your device.'")


def extensions_env() -> dict[str, str]:
    """path.sh's TORCH_EXTENSIONS_DIR (the venv's): the ops DeepSpeed builds for run.sh (the CPU
    communication op, CPU Adam for offload) are built once for both."""
    default = (ROOT / ".venv").resolve() / "torch_extensions"
    return {"TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR", str(default))}


def zero_run(prepared: Path, config: str) -> ZeroRun:
    """Train (and kill, resume, average) ``config``'s run; asserts each start ends as it should."""
    from tests.faults.test_divergence import train

    if config == "ds_stage1_fp16" and (why := fp16_unsupported()):
        pytest.skip(why)
    exp = f"exp_{config}"
    options = ("--ds-config", str(ROOT / "ds_configs" / f"{config}.json"))
    killed = config in KILLED
    env = {**extensions_env(), **({"FUNASR_RECIPE_CKPT_KILL": KILL} if killed else {})}
    rc, first = train(prepared, exp, *options, overrides=EPOCHS, env=env, timeout=900)
    assert (rc != 0) == killed, first[-4000:]
    resumed = None
    if killed:
        rc, resumed = train(prepared, exp, *options, overrides=EPOCHS, env=extensions_env(), timeout=900)
        assert rc == 0, resumed[-4000:]
        (prepared / f"{exp}.resumed.log").write_text(resumed)
        (prepared / f"{exp}.log").write_text(first)  # train() wrote the resumed log over it
    # Both epochs averaged whatever their losses (stage 3's margin would leave epoch 1 out of so short a
    # run): what is tested is reading and averaging the shards; the validation check still chooses.
    outcome = (None if config == "ds_stage1_bf16"
               else finalize(prepared / exp, 2, prepared / exp / "final", margin=100.0))
    return ZeroRun(config, prepared / exp, first, resumed, outcome)


@pytest.fixture(scope="session")
def zero_runs(prepared: Path) -> Callable[[str], ZeroRun]:
    """``zero_runs(config)``: that config's run, trained on first use."""
    done: dict[str, ZeroRun | BaseException] = {}

    def get(config: str) -> ZeroRun:
        if config not in done:
            try:
                done[config] = zero_run(prepared, config)
            except BaseException as e:  # a failed or skipped run is not trained again for the next test
                done[config] = e
        if isinstance(got := done[config], BaseException):
            raise got
        return got

    return get
