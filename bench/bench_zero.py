"""Benchmark of the DeepSpeed configs of ds_configs/: what each shards, the model states per GPU DeepSpeed's
estimators give for SenseVoiceSmall, and, measured on CPU for the tiny SenseVoice, the model states
DeepSpeed holds per process and the step time relative to ZeRO-1 (docs/zero_stages.md's table).

Reads the bundled digit corpus; runs stages 0-1 (no speed perturbation) into a temporary folder (or
--work-dir), then for each config one epoch of ``local.train`` under torchrun (2 CPU ranks, as run.sh
starts it); writes the table (markdown) to stdout and, with --out-json, the figures as JSON.

- estimated: funasr_recipe/train/memory.py ``model_states`` (DeepSpeed's estimate_zero{2,3}_model_states_
  mem_needs, the JSON's offload) for the released SenseVoiceSmall architecture (random weights, built here)
  on --gpus GPUs of one node, and for the tiny model on the 2 ranks it trains with;
- measured: the line the trainer hooks log after the first step (``held_tensor_bytes`` of the engine's
  module and optimizer on rank 0: 16-bit weights and gradients, fp32 masters, Adam's moments). On CPU
  an offloaded state stays in the same memory: the process holds what it would have held;
- step time: the median of rank 0's per-step ``total_time`` (funasr's speed stats) after the first
  3 steps, over ZeRO-1's from the same run of this benchmark.

  . ./path.sh && python -m bench.bench_zero --out-json exp/bench_zero.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.gpu.random_model_dir import architecture, build_model
from funasr_recipe.core.cli import program_parser
from funasr_recipe.train.memory import GIB, model_states
from funasr_recipe.train.zero import ZeroSettings, read_ds_config

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "conf" / "tiny_sensevoice.yaml"
STEP = re.compile(r"\] train, rank: 0, .*?'total_time': '([\d.]+)'")
HELD = re.compile(r"\[node0 rank0\] .*model states after the first step: ([\d.]+) GiB on cpu")
SHARDS = {1: "optimizer states", 2: "optimizer states, gradients", 3: "optimizer states, gradients, weights"}


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=ROOT, check=True, text=True, **kw)


def prepare(work: Path) -> None:
    run(["./run.sh", "--stop-stage", "1", "--speed-perturb", "1.0", "--data-dir", str(work / "data"),
         "--dump-dir", str(work / "dump"), "--exp-dir", str(work / "exp_prep")], capture_output=True)


def train(work: Path, ds_config: Path, port: int) -> dict:
    """One epoch under ``ds_config``; its measured figures from the log."""
    exp = work / f"exp_{ds_config.stem}"
    shutil.rmtree(exp, ignore_errors=True)
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
           "--master-port", str(port),
           "-m", "local.train", "--config", str(CONFIG), "--exp-dir", str(exp),
           "--data-dir", str(work / "data"), "--dump-dir", str(work / "dump"), "--train-set", "train",
           "--valid-set", "dev", "--ds-config", str(ds_config), "--oom-probe", "false",
           "--", "++train_conf.max_epoch=1", "++train_conf.log_interval=1"]
    res = subprocess.run(cmd, cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    (work / f"{exp.name}.log").write_text(res.stdout)
    if res.returncode != 0:
        raise RuntimeError(f"{ds_config.name}: training failed; see {work / f'{exp.name}.log'}")
    steps = [float(t) for t in STEP.findall(res.stdout)]
    held = HELD.search(res.stdout)
    return {"steps": len(steps), "step_s": statistics.median(steps[3:]) if len(steps) > 3 else None,
            "held_gib": float(held.group(1)) if held else None}


def estimates(configs: list[Path], gpus: int) -> dict[str, dict]:
    """Per config: model states per GPU and CPU per node for SenseVoiceSmall on ``gpus`` GPUs, and for
    the tiny model on 2 ranks."""
    big, tiny = build_model(architecture("released")), build_model(architecture("tiny"))
    out = {}
    for path in configs:
        zero = ZeroSettings.of(read_ds_config(path))
        plan, small = model_states(big, zero, gpus, 1), model_states(tiny, zero, 2, 1)
        out[path.stem] = {"zero": zero, "params": plan.params, "gpu_gib": plan.bytes_per_gpu / GIB,
                          "cpu_gib": plan.cpu_bytes_per_node / GIB, "tiny_gib": small.bytes_per_gpu / GIB}
    return out


def table(est: dict[str, dict], measured: dict[str, dict], gpus: int) -> str:
    base = measured.get("ds_stage1_bf16", {}).get("step_s")
    lines = [f"| config | shards | offloaded to CPU | SenseVoiceSmall, per GPU of {gpus} (estimated) | "
             "tiny, per process (estimated) | tiny, per process (measured on CPU) | step time on CPU vs "
             "ZeRO-1 |", "|---|---|---|---|---|---|---|"]
    for name, e in est.items():
        zero, m = e["zero"], measured.get(name, {})
        off = " and ".join(w for w, on in (("optimizer", zero.offload_optimizer),
                                           ("weights", zero.offload_param)) if on) or "nothing"
        ratio = f"{m['step_s'] / base:.2f}x" if base and m.get("step_s") else "n/a"
        held = f"{m['held_gib'] * 1024:.0f} MiB" if m.get("held_gib") is not None else "n/a"
        lines.append(f"| {name}.json | {SHARDS.get(zero.stage, 'nothing')} | {off} | {e['gpu_gib']:.2f} GiB "
                     f"(+{e['cpu_gib']:.1f} GiB CPU per node) | {e['tiny_gib'] * 1024:.0f} MiB | {held} | "
                     f"{ratio} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = program_parser(__doc__)
    parser.add_argument("--work-dir", type=Path, help="default: a temporary folder, removed afterwards")
    parser.add_argument("--gpus", type=int, default=8, help="GPUs of one node (SenseVoiceSmall figures)")
    parser.add_argument("--configs", nargs="*", type=Path, help="default: every ds_configs/*.json")
    parser.add_argument("--out-json", type=Path)
    parser.add_argument("--port", type=int, default=29673)
    args: argparse.Namespace = parser.parse_args(argv)
    configs = args.configs or sorted((ROOT / "ds_configs").glob("*.json"))
    est = estimates(configs, args.gpus)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="bench_zero."))
    measured: dict[str, dict] = {}
    try:
        if not (work / "dump" / ".done").is_file():
            prepare(work)
        for path in configs:
            try:
                measured[path.stem] = train(work, path, args.port)
            except RuntimeError as e:  # fp16 where the CPU has none: the row says n/a
                print(f"# {e}")
    finally:
        if args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    print(table(est, measured, args.gpus))
    if args.out_json:
        args.out_json.write_text(json.dumps(
            {"gpus": args.gpus, "estimated": {k: {**v, "zero": v["zero"].describe()} for k, v in est.items()},
             "measured": measured}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
