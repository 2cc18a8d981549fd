"""bench/bench_comm.py: the bytes DeepSpeed's ZeRO-1/2 exchange per optimizer step (as stage_1_and_2.py of
DeepSpeed 0.19.8 sends them), their time at a link's speed, the speedups they allow, and the parameter count
read from a config without the hub."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.bench_comm import GUIDE, Zero, main, needed_compute, seconds, speedup, step_bytes, zero_of
from funasr_recipe.core.rejections import BadInputError

ROOT = Path(__file__).resolve().parents[3]
DS = ROOT / "ds_configs"
SENSEVOICE_SMALL = 233_999_167  # conf/sensevoice_small.yaml on the meta device (the released 234 M)


def test_the_recipes_deepspeed_configs_are_read_as_deepspeed_reads_them(tmp_path: Path) -> None:
    assert zero_of(DS / "ds_stage1_bf16.json") == Zero(stage=1, dtype="bf16", accum=1, allreduce=True)
    assert zero_of(DS / "ds_stage2_bf16.json").stage == 2
    assert zero_of(DS / "ds_stage1_fp16.json").dtype == "fp16"
    with pytest.raises(BadInputError, match="ZeRO stage 3; the budget models stages 1 and 2"):
        zero_of(DS / "ds_stage3_bf16.json")
    conf = json.loads((DS / "ds_stage1_bf16.json").read_text())
    conf["zero_optimization"]["use_multi_rank_bucket_allreduce"] = False  # reduce to each owner instead
    conf |= {"gradient_accumulation_steps": 4, "communication_data_type": "FP32"}
    (tmp_path / "ds.json").write_text(json.dumps(conf))
    assert zero_of(tmp_path / "ds.json") == Zero(stage=1, dtype="fp32", accum=4, allreduce=False)


def test_zero1_sends_a_ring_all_reduce_of_the_gradients_and_an_all_gather_of_the_parameters() -> None:
    zero1 = Zero(stage=1, dtype="bf16", accum=4, allreduce=True)
    grad, gather = step_bytes(1_000_000, 16, zero1)
    assert grad == pytest.approx(2 * 15 / 16 * 2e6) and gather == pytest.approx(15 / 16 * 2e6)
    # Accumulation does not add to ZeRO-1's exchange; ZeRO-2 reduces every micro-batch.
    assert step_bytes(1_000_000, 16, Zero(2, "bf16", 4, True))[0] == pytest.approx(4 * grad)
    assert step_bytes(1_000_000, 16, Zero(1, "bf16", 1, False))[0] == pytest.approx(grad / 2)
    assert step_bytes(1_000_000, 16, Zero(1, "fp32", 1, True))[1] == pytest.approx(2 * gather)
    assert step_bytes(1_000_000, 1, zero1) == (0.0, 0.0)  # one process sends nothing
    assert seconds(1.25e9, 10) == pytest.approx(1.0)  # 10 Gb/s moves 1.25 GB a second


def test_the_compute_a_guide_speedup_needs_gives_that_speedup() -> None:
    for nodes, target in GUIDE.items():
        compute = needed_compute(nodes, target, exchange=0.3)
        assert speedup(nodes, compute, 0.3) == pytest.approx(target)
    assert speedup(1, 1.0, 5.0) == 1.0 and speedup(2, 1.0, 0.0) == 2.0


def test_the_table_for_sensevoice_small_from_its_config(capsys: pytest.CaptureFixture) -> None:
    """The parameter count comes from conf/sensevoice_small.yaml (the released architecture on the meta
    device, no hub); 2 nodes of 8 GPUs at 10 Gb/s move 1.316 GB in 1.053 s per step."""
    assert main(["--config", str(ROOT / "conf" / "sensevoice_small.yaml")]) == 0
    out = capsys.readouterr().out
    assert f"{SENSEVOICE_SMALL:,} parameters; ZeRO-1, bf16" in out
    assert "| 2 | 16 | 1.316 (0.877 + 0.439) | 1.053 s | 0.105 s | 0.053 s |" in out
    assert "| 2 | 16 | 1.85x | 12.987 s |" in out  # the guide's speedup needs 12.3 x the exchange


def test_speedups_for_a_step_time_and_a_measured_bandwidth(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture) -> None:
    preflight = tmp_path / "preflight.json"
    preflight.write_text(json.dumps({"bandwidth": {"sizes": [{"size_mib": 16, "busbw_gbps": 1.0},
                                                             {"size_mib": 256, "busbw_gbps": 5.0}]}}))
    assert main(["--params", str(SENSEVOICE_SMALL), "--gbps", "100", "--nodes", "2", "--step-seconds", "0.5",
                 "--accum-grad", "2", "--preflight-json", str(preflight)]) == 0
    out = capsys.readouterr().out
    assert "| nodes | GPUs | guide | 100 Gb/s | 40 Gb/s |" in out  # 5 GB/s of bus bandwidth = 40 Gb/s
    assert "| 2 | 16 | 1.85x | 1.81x - 1.93x |" in out
    (tmp_path / "empty.json").write_text("{}")
    assert main(["--params", "1", "--preflight-json", str(tmp_path / "empty.json")]) == 2
    assert main(["--params", "1", "--nodes", "0"]) == 2
