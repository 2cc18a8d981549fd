"""Benchmark stage 2 on CPU: training utterances/s of the tiny SenseVoice against funasr's default path.

Reads the bundled digit corpus; runs stages 0-1 (no speed perturbation) into a temporary folder (or
--work-dir), then one epoch of ``local.train`` under torchrun (DeepSpeed ZeRO-1 bf16 unless
--engine ddp) for each row:

  funasr default    --feats-type raw: funasr's SenseVoiceCTCDataset decodes the audio and computes
                    fbank in the DataLoader every step; funasr's BatchSampler; 1 process, then 2
  stage-1 features  FbankSenseVoiceCTCDataset + LengthBucketBatchSampler; 1 process, then 2
  funasr's losses   (--losses: only these two rows) stage-1 features, 2 processes, with
                    ``local.train --fused-losses false`` (funasr's own CTC/label-smoothing/accuracy
                    code) against the default (funasr_recipe/compat/fused_losses.py)

Throughput is training utterances of the epoch / the epoch's wall time (from the log lines "Train
epoch: 0" to "Validate epoch: 1", so start-up and validation are excluded); data waiting is the sum
of funasr's per-step ``data_load`` over the sum of ``total_time`` on rank 0. All ratios are from this
one run. torch uses one thread per rank (path.sh), as in training.

  .venv/bin/python -m bench.bench_train --out-json exp/bench_train.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from datetime import datetime
from pathlib import Path

from funasr_recipe.core.cli import program_parser
from funasr_recipe.core.env import recipe_env

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "conf" / "tiny_sensevoice.yaml"
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+) .*\[node0 rank0\]")


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=ROOT, check=True, text=True, **kw)


def prepare(work: Path) -> None:
    run(["./run.sh", "--stop-stage", "1", "--speed-perturb", "1.0", "--data-dir", str(work / "data"),
         "--dump-dir", str(work / "dump"), "--exp-dir", str(work / "exp_prep")], capture_output=True)


def train_command(exp: Path, work: Path, nproc: int, feats: str, sampler: str, engine: str, batch: int,
                  workers: int, fused: bool) -> list[str]:
    """One epoch of local.train under torchrun, as this interpreter's module: no torchrun on PATH needed."""
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(nproc),
            "--master-port", "29671", "-m", "local.train", "--config", str(CONFIG), "--exp-dir", str(exp),
            "--data-dir", str(work / "data"), "--dump-dir", str(work / "dump"), "--train-set", "train",
            "--valid-set", "dev", "--feats-type", feats, "--train-engine", engine,
            "--fused-losses", str(fused).lower(),
            "--", "++train_conf.max_epoch=1", "++train_conf.log_interval=1",
            f"++dataset_conf.batch_sampler={sampler}", f"++dataset_conf.batch_size={batch}",
            f"++dataset_conf.num_workers={workers}"]


def train(work: Path, name: str, nproc: int, feats: str, sampler: str, engine: str, batch: int,
          workers: int = 1, fused: bool = True) -> dict:
    exp = work / name
    shutil.rmtree(exp, ignore_errors=True)
    cmd = train_command(exp, work, nproc, feats, sampler, engine, batch, workers, fused)
    # path.sh's environment, as run.sh trains (one thread per rank, ninja on PATH), whether or not the
    # caller sourced it: `.venv/bin/python -m bench.bench_train` from a fresh shell measures the same.
    env = {**recipe_env(ROOT), "DS_ACCELERATOR": "cpu"}
    out = run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT).stdout  # Hydra logs to stdout
    (exp / "bench.log").write_text(out)
    lines = [line for line in out.splitlines() if "[node0 rank0]" in line]
    start = next(line for line in lines if "Train epoch: 0, rank: 0" in line)
    end = next(line for line in lines if "Validate epoch: 1, rank: 0" in line)
    seconds = (_time(end) - _time(start)).total_seconds()
    utts = sum(1 for _ in open(work / ("dump" if feats == "fbank" else "data") / "train" / "data.jsonl"))
    load = [float(x) for x in re.findall(r"train, rank: 0,.*?'data_load': '([\d.]+)'", out)]
    total = [float(x) for x in re.findall(r"train, rank: 0,.*?'total_time': '([\d.]+)'", out)]
    return {"utt_per_s": utts / seconds, "epoch_s": seconds, "steps_rank0": len(total),
            "data_wait": sum(load) / max(sum(total), 1e-9)}


def compare_losses(work: Path, args: argparse.Namespace) -> None:
    """Two rows of one run: funasr's loss code, then the fused one; the ratio of their epoch times."""
    rows = {fused: train(work, f"losses_{fused}", 2, "fbank", "LengthBucketBatchSampler", args.engine,
                         args.batch_size, args.fbank_workers, fused=fused) for fused in (False, True)}
    for fused, r in rows.items():
        name = "fused losses (default)" if fused else "funasr's losses (--fused-losses false)"
        print(f"{name:40s} {r['utt_per_s']:7.1f} utt/s {r['epoch_s']:7.1f} s/epoch "
              f"{r['steps_rank0']:4d} steps")
    print(f"fused / funasr's: {rows[True]['utt_per_s'] / rows[False]['utt_per_s']:.2f}x utt/s (one run, "
          f"{os.cpu_count()} cores, 2 processes)")


def _time(line: str) -> datetime:
    return datetime.strptime(STAMP.match(line).group(1), "%Y-%m-%d %H:%M:%S,%f")


def main() -> None:
    parser = program_parser(__doc__)
    parser.add_argument("--engine", choices=("deepspeed", "ddp"), default="deepspeed")
    parser.add_argument("--batch-size", type=int, default=6000, help="padded fbank frames per rank")
    parser.add_argument("--fbank-workers", type=int, default=1,
                        help="DataLoader workers per rank for the stage-1 rows (funasr's row keeps 1)")
    parser.add_argument("--work-dir", type=Path)
    parser.add_argument("--out-json", type=Path)
    parser.add_argument("--losses", action="store_true",
                        help="only funasr's losses against the fused ones (stage-1 features, 2 processes)")
    args = parser.parse_args()
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="bench_train."))
    prepare(work)
    if args.losses:
        compare_losses(work, args)
        return
    raw = {n: train(work, f"raw{n}", n, "raw", "BatchSampler", args.engine, args.batch_size) for n in (1, 2)}
    fbank = {n: train(work, f"fbank{n}", n, "fbank", "LengthBucketBatchSampler", args.engine, args.batch_size,
                      args.fbank_workers) for n in (1, 2)}
    rows = {f"funasr default (raw audio, BatchSampler), {n} proc": raw[n] for n in (1, 2)}
    rows |= {f"stage-1 features (LengthBucket), {n} proc": fbank[n] for n in (1, 2)}
    print(f"\ntiny_sensevoice, {args.engine}, batch_size {args.batch_size} frames per rank, one epoch of the "
          f"bundled corpus (2000 utterances), {os.cpu_count()} cores, one torch thread per rank, stage-1 "
          f"rows with {args.fbank_workers} DataLoader worker(s) per rank")
    print(f"{'run':48s} {'utt/s':>7s} {'epoch s':>8s} {'steps':>6s} {'data wait':>10s}")
    for name, r in rows.items():
        print(f"{name:48s} {r['utt_per_s']:7.1f} {r['epoch_s']:8.1f} {r['steps_rank0']:6d} "
              f"{r['data_wait']:9.1%}")
    speed = {k: {n: r[n]["utt_per_s"] for n in (1, 2)} for k, r in (("raw", raw), ("fbank", fbank))}
    ratios = {"stage-1 features / funasr default, 1 process": (speed["fbank"][1] / speed["raw"][1], 2.5),
              "stage-1 features / funasr default, 2 processes": (speed["fbank"][2] / speed["raw"][2], None),
              "2 processes / 1 process (stage-1 features)": (speed["fbank"][2] / speed["fbank"][1], 1.85),
              "2 processes / 1 process (funasr default)": (speed["raw"][2] / speed["raw"][1], None)}
    for name, (value, target) in ratios.items():
        verdict = "" if target is None else f" (target >= {target}: {'ok' if value >= target else 'MISSED'})"
        print(f"{name:48s} {value:6.2f}x{verdict}")
    wait = max(r["data_wait"] for r in fbank.values())
    verdict = "ok" if wait <= 0.05 else "MISSED"
    print(f"{'data waiting, stage-1 features (worst)':48s} {wait:6.1%} (target <= 5%: {verdict})")
    if args.out_json:
        args.out_json.parent.mkdir(parents=True, exist_ok=True)
        args.out_json.write_text(json.dumps({"rows": rows, "ratios": {k: v[0] for k, v in ratios.items()}},
                                            indent=2))
    if not args.work_dir:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
