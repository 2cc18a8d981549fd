"""bench/bench_train.py starts its training runs without torchrun on PATH (a shell without path.sh)."""

from __future__ import annotations

import sys
from pathlib import Path

from bench.bench_train import train_command


def test_training_runs_start_torchrun_as_a_module_of_this_interpreter(tmp_path: Path) -> None:
    cmd = train_command(tmp_path / "exp", tmp_path, 2, "fbank", "LengthBucketBatchSampler", "deepspeed", 6000,
                        1, True)
    assert cmd[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert cmd[cmd.index("-m", 3):][:2] == ["-m", "local.train"]
    assert "--nproc-per-node" in cmd and cmd[cmd.index("--nproc-per-node") + 1] == "2"
