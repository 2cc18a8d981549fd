"""The GPU check's figures (bench/gpu/check.sh), computed from what its runs wrote.

Reads  each training run's train.log (rank 0's ``train_metrics:`` lines of funasr_recipe/train/metrics.py,
       through reports/curves.py's parser, and funasr's per-rank ``GPU, memory: ... peak`` lines), the
       model dir's configuration.json (the parameter count bench/gpu/random_model_dir.py recorded) and a
       decode dir's shard stats (scoring/decode_dir.py); writes the table to stdout and, with --json,
       the same figures as JSON.

Per training run, over the log intervals after the first ``--skip`` (start-up: allocator, autotuning):
the median of the intervals' rates, since the intervals that hold a validation and a checkpoint are
slower by what they hold, not by the training step. ``utt_per_s``/``frames_per_s`` are rank 0's, times
the world size (the recipe's sampler gives every rank the same number of steps). Model FLOP utilisation
is 6 x parameters x LFR frames per second (forward and backward) over ``--peak-tflops`` (default 989:
the H200's dense bf16 peak in NVIDIA's data sheet; a large bf16 matrix product reaches about 790 there).

  python -m bench.gpu.report --model-dir exp/gpu_check/model --world-size 1 \\
      --train deepspeed=exp/gpu_check/exp_deepspeed/train.log --decode exp/gpu_check/decode_dev
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from pathlib import Path

from omegaconf import OmegaConf

from funasr_recipe.core.cli import program_parser
from funasr_recipe.core.rejections import BadInputError
from funasr_recipe.reports.curves import parse_log
from funasr_recipe.scoring.decode_dir import shard_file

H200_BF16_DENSE_TFLOPS = 989.0
# funasr 1.4.16 trainer_ds.Trainer.log, on every rank (torch.cuda's counters: 0 on CPU).
MEMORY = re.compile(r"\[node\d+ rank\d+\] .*GPU, memory: usage: [\d.]+ GB, peak: ([\d.]+) GB, "
                    r"cache: [\d.]+ GB, cache_peak: ([\d.]+) GB")


def _median(values: list[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return statistics.median(finite) if finite else math.nan


def train_figures(log: Path, params: int, world_size: int = 1, lfr_n: int = 6, frame_shift_ms: float = 10.0,
                  peak_tflops: float = H200_BF16_DENSE_TFLOPS, skip: int = 1) -> dict:
    """The figures of one training run; raises ValueError when its log has no interval past ``skip``."""
    curves = parse_log(log)
    n = len(curves.metric_step)
    if n <= skip:
        raise BadInputError(f"{log}: {n} train_metrics lines, need more than {skip} (is "
                            "train_conf.log_interval below the steps of the run?)")
    frames_s = _median(curves.frames_per_s[skip:]) * world_size  # 10 ms feature frames
    lfr_frames_s = frames_s / lfr_n
    text = log.read_text(encoding="utf-8", errors="replace")
    peaks = [(float(a), float(r)) for a, r in MEMORY.findall(text)]
    return {"intervals": n - skip, "last_step": curves.metric_step[-1],
            "utt_per_s": _median(curves.utt_per_s[skip:]) * world_size,
            "audio_s_per_s": frames_s * frame_shift_ms / 1000.0,
            "lfr_frames_per_s": lfr_frames_s,
            "model_flop_utilisation": 6.0 * params * lfr_frames_s / (peak_tflops * 1e12),
            "data_wait": _median(curves.data_wait[skip:]),
            "peak_gpu_gib": max((a for a, _ in peaks), default=math.nan),
            "peak_reserved_gib": max((r for _, r in peaks), default=math.nan)}


def decode_figures(decode_dir: Path, world_size: int = 1) -> dict:
    """Audio seconds, decoding seconds and RTF over the shards of a local/decode.py work run."""
    stats = [json.loads(shard_file(decode_dir, r, "stats.json").read_text()) for r in range(world_size)]
    audio = sum(s["audio_seconds"] for s in stats)
    seconds = sum(s["decode_seconds"] for s in stats)
    return {"audio_seconds": audio, "decode_seconds": seconds, "rtf": seconds / audio if audio else math.nan,
            "device": stats[0].get("device")}


def model_facts(model_dir: Path) -> tuple[int, int, float]:
    """(parameters, LFR stride, frame shift in ms) of a model dir random_model_dir.py wrote."""
    conf = json.loads((model_dir / "configuration.json").read_text(encoding="utf-8"))
    frontend = OmegaConf.load(model_dir / "config.yaml").frontend_conf
    return int(conf["recipe"]["parameters"]), int(frontend.lfr_n), float(frontend.frame_shift)


def table(runs: dict[str, dict], decode: dict | None, params: int, peak_tflops: float) -> str:
    """The figures as the check prints them (one row per training run)."""
    lines = [f"model: SenseVoiceSmall layout, {params / 1e6:.1f} M parameters; FLOP utilisation = 6 x params "
             f"x LFR frames/s over {peak_tflops:g} TFLOP/s (bf16 dense peak)",
             f"{'run':<10} {'utt/s':>9} {'audio s/s':>10} {'MFU':>7} {'data wait':>10} {'peak GiB':>9} "
             f"{'reserved':>9} {'intervals':>9}"]
    for name, f in runs.items():
        lines.append(f"{name:<10} {f['utt_per_s']:>9.1f} {f['audio_s_per_s']:>10.1f} "
                     f"{100 * f['model_flop_utilisation']:>6.2f}% {100 * f['data_wait']:>9.1f}% "
                     f"{f['peak_gpu_gib']:>9.2f} {f['peak_reserved_gib']:>9.2f} {f['intervals']:>9d}")
    if decode:
        lines.append(f"decoding ({decode['device']}): {decode['audio_seconds']:.1f} s of audio in "
                     f"{decode['decode_seconds']:.2f} s, RTF {decode['rtf']:.4f}")
    return "\n".join(lines)


def named_path(value: str) -> tuple[str, Path]:
    name, sep, path = value.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"{value!r}: expected NAME=PATH")
    return name, Path(path)


def main(argv: list[str] | None = None) -> int:
    parser = program_parser(__doc__)
    parser.add_argument("--model-dir", type=Path, required=True, help="the model dir that was trained")
    parser.add_argument("--train", type=named_path, action="append", default=[],
                        help="NAME=train.log of one training run (repeatable)")
    parser.add_argument("--decode", type=Path, help="the decode dir of local/decode.py work")
    parser.add_argument("--world-size", type=int, default=1, help="training processes")
    parser.add_argument("--decode-world-size", type=int, default=1, help="decoding processes")
    parser.add_argument("--peak-tflops", type=float, default=H200_BF16_DENSE_TFLOPS)
    parser.add_argument("--skip", type=int, default=1, help="first log intervals left out (start-up)")
    parser.add_argument("--extra", type=named_path, action="append", default=[],
                        help="NAME=JSON file merged into the --json output (e.g. phase timings)")
    parser.add_argument("--json", type=Path, help="write the figures here as JSON")
    args = parser.parse_args(argv)
    params, lfr_n, frame_shift_ms = model_facts(args.model_dir)
    runs = {name: train_figures(log, params, args.world_size, lfr_n, frame_shift_ms, args.peak_tflops,
                                args.skip) for name, log in args.train}
    decode = decode_figures(args.decode, args.decode_world_size) if args.decode else None
    print(table(runs, decode, params, args.peak_tflops))
    if args.json:
        out = {"parameters": params, "peak_tflops": args.peak_tflops, "world_size": args.world_size,
               "train": runs, "decode": decode,
               **{name: json.loads(path.read_text(encoding="utf-8")) for name, path in args.extra}}
        args.json.write_text(json.dumps(out, indent=2, allow_nan=True) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
