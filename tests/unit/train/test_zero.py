"""What the recipe reads from a DeepSpeed JSON (funasr_recipe/train/zero.py), and the memory plan's figures
for each ZeRO stage and offload (funasr_recipe/train/memory.py) against the tables DeepSpeed's own
``estimate_zero{2,3}_model_states_mem_needs_all_live`` print for the same model (the ones funasr's
trainer prints at start-up); the offload config's optimizer swap (compat/offload.py) without training.

Reads ds_configs/*.json; writes nothing.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from funasr_recipe.compat.offload import SETTINGS, cpu_adam_factory
from funasr_recipe.core.rejections import BadInputError
from funasr_recipe.train.memory import model_states
from funasr_recipe.train.zero import ZeroSettings, read_ds_config

ROOT = Path(__file__).resolve().parents[3]
ROW = re.compile(r"^\s*([\d.]+)GB \|\s*([\d.]+)GB \| (.*)$")


def test_every_shipped_config_says_what_it_shards_and_offloads() -> None:
    got = {p.name: ZeroSettings.of(read_ds_config(p)) for p in sorted((ROOT / "ds_configs").glob("*.json"))}
    assert got == {"ds_stage1_bf16.json": ZeroSettings(1), "ds_stage1_fp16.json": ZeroSettings(1),
                   "ds_stage2_bf16.json": ZeroSettings(2), "ds_stage3_bf16.json": ZeroSettings(3),
                   "ds_stage3_offload_bf16.json": ZeroSettings(3, True, True)}
    assert got["ds_stage3_offload_bf16.json"].describe() == "ZeRO-3, optimizer and parameters offloaded"
    # DeepSpeed offloads parameters under ZeRO-3 only; "none" is its default device.
    conf = {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "none"},
                                  "offload_param": {"device": "cpu"}}}
    assert ZeroSettings.of(conf) == ZeroSettings(2)


def test_a_ds_config_that_is_not_json_is_named_with_its_line(tmp_path: Path) -> None:
    bad = tmp_path / "ds.json"
    bad.write_text('{\n  "zero_optimization": {"stage": 3,}\n}\n')
    with pytest.raises(BadInputError, match=rf"{bad}:2:\d+: not valid JSON"):
        read_ds_config(bad)


def deepspeed_table(capsys: pytest.CaptureFixture[str], stage: int, model: torch.nn.Module) -> dict:
    """DeepSpeed's printed table for ``model`` on 2 nodes x 4 GPUs: options -> (per CPU, per GPU) GB."""
    if stage == 3:
        from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs_all_live as live
    else:
        from deepspeed.runtime.zero.stage_1_and_2 import (
            estimate_zero2_model_states_mem_needs_all_live as live,
        )
    capsys.readouterr()
    live(model, num_gpus_per_node=4, num_nodes=2)
    rows = [ROW.match(line) for line in capsys.readouterr().out.splitlines()]
    # DeepSpeed formats its enum: "OffloadDeviceEnum.cpu" under Python 3.11, "cpu " under older ones.
    return {re.sub(r"OffloadDeviceEnum\.| ", "", m.group(3)): (float(m.group(1)), float(m.group(2)))
            for m in rows if m}


def test_the_memory_plan_is_deepspeeds_estimate_with_and_without_offload(
        capsys: pytest.CaptureFixture[str]) -> None:
    # Big enough that DeepSpeed's two decimals of GB tell the rows apart: 80 M parameters.
    model = torch.nn.Sequential(*[torch.nn.Linear(2000, 2000) for _ in range(20)])

    def ours(zero: ZeroSettings) -> tuple[float, float]:
        plan = model_states(model, zero, nproc_per_node=4, nnodes=2)
        return round(plan.cpu_bytes_per_node / 2**30, 2), round(plan.bytes_per_gpu / 2**30, 2)

    z3 = deepspeed_table(capsys, 3, model)
    # funasr builds the whole model on every rank before DeepSpeed partitions it: zero_init=0's rows.
    assert ours(ZeroSettings(3, True, True)) == z3["offload_param=cpu,offload_optimizer=cpu,zero_init=0"]
    assert ours(ZeroSettings(3, True, False)) == z3["offload_param=none,offload_optimizer=cpu,zero_init=0"]
    assert ours(ZeroSettings(3)) == z3["offload_param=none,offload_optimizer=none,zero_init=0"]
    z2 = deepspeed_table(capsys, 2, model)
    assert ours(ZeroSettings(2, True)) == z2["offload_optimizer=cpu"]
    assert ours(ZeroSettings(2)) == z2["offload_optimizer=none"]
    # Offloading both leaves one gathered layer per GPU: less than a tenth of ZeRO-3's.
    assert ours(ZeroSettings(3, True, True))[1] < 0.1 * ours(ZeroSettings(3))[1]


def test_offloaded_adamw_keeps_torchs_defaults_and_refuses_what_cpu_adam_lacks() -> None:
    import inspect

    defaults = inspect.signature(torch.optim.AdamW).parameters
    assert defaults["weight_decay"].default == 0.01  # DeepSpeedCPUAdam's own default is 0: not taken
    with pytest.raises(BadInputError, match="optim_conf foreach: DeepSpeed's CPU Adam, which runs adamw"):
        cpu_adam_factory("adamw")([torch.nn.Parameter(torch.zeros(2))], lr=0.1, foreach=True)
    assert set(SETTINGS) <= set(defaults)


def test_held_states_count_each_storage_once_wherever_it_is_referenced() -> None:
    from funasr_recipe.train.memory import held_tensor_bytes

    model = torch.nn.Sequential(torch.nn.Linear(100, 100), torch.nn.Linear(100, 10))
    optim = torch.optim.AdamW(model.parameters())
    model(torch.randn(3, 100)).sum().backward()
    optim.step()
    weights = 4 * sum(p.numel() for p in model.parameters())
    # weights, gradients, Adam's two moments, and its step counters (4 bytes per parameter tensor)
    assert held_tensor_bytes(model, optim) == {"cpu": 4 * weights + 4 * 4}
    flat = torch.zeros(1000)
    # A flat buffer and its views (DeepSpeed's partitions), and a tensor's own attribute (ZeRO-3's
    # ds_tensor), each counted once.
    param = torch.nn.Parameter(torch.zeros(0))
    param.ds_tensor = flat[500:]
    held = held_tensor_bytes({"views": [flat[:500], flat[500:]], "param": param, "again": flat})
    assert held == {"cpu": 4000}
