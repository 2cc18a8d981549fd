"""bench/bench_zero.py's table from given figures (the benchmark itself trains every config: the lead runs
it alone, docs/zero_stages.md says how)."""

from __future__ import annotations

from bench.bench_zero import table
from funasr_recipe.train.zero import ZeroSettings


def test_the_table_gives_each_config_its_sharding_and_step_time_relative_to_zero_1() -> None:
    est = {"ds_stage1_bf16": {"zero": ZeroSettings(1), "gpu_gib": 1.31, "cpu_gib": 10.46, "tiny_gib": 0.049},
           "ds_stage3_offload_bf16": {"zero": ZeroSettings(3, True, True), "gpu_gib": 0.05, "cpu_gib": 10.46,
                                      "tiny_gib": 0.012},
           "ds_stage1_fp16": {"zero": ZeroSettings(1), "gpu_gib": 1.31, "cpu_gib": 10.46, "tiny_gib": 0.049}}
    measured = {"ds_stage1_bf16": {"step_s": 0.5, "held_gib": 0.04},
                "ds_stage3_offload_bf16": {"step_s": 0.75, "held_gib": 0.125}}
    rows = table(est, measured, 8).splitlines()
    assert "per GPU of 8 (estimated)" in rows[0] and len(rows) == 5
    assert rows[2] == ("| ds_stage1_bf16.json | optimizer states | nothing | 1.31 GiB (+10.5 GiB CPU per "
                       "node) | 50 MiB | 41 MiB | 1.00x |")
    assert rows[3].startswith("| ds_stage3_offload_bf16.json | optimizer states, gradients, weights | "
                              "optimizer and weights | 0.05 GiB")
    assert rows[3].endswith("| 128 MiB | 1.50x |")
    assert rows[4].endswith("| n/a | n/a |")  # not measured (fp16 where the CPU has none)
