"""Benchmark the runtimes of an exported model on CPU (and CUDA where present): stage 5's benchmark
(python -m local.bench_runtime) run outside the stage, so that the stage's own benchmark.{md,json} stay as
they are.

Reads <exp-dir>/export/ and <exp-dir>/final/ (stages 3-4: ./run.sh --stop-stage 4 --config
conf/tiny_sensevoice.yaml writes both for the demo) and a test set's data.jsonl; prints the table
(PyTorch eager through funasr's AutoModel.generate, funasr-onnx fp32/int8, the recipe's ONNX runtime
fp32/int8, sherpa-onnx fp32/int8 for SenseVoiceSmall; p50/p95 latency per batch, utterances/s and RTF
at batch 1, 8 and 32, end to end from audio file to text) and the recipe's two performance targets
(funasr_recipe/runtime/benchmark.py TARGETS: here, not in stage 5's report), all measured in this one
run; --out-json keeps the report; --strict exits 1 when a target is MISSED.

  .venv/bin/python -m bench.bench_runtime [--exp-dir exp/tiny_sensevoice] \\
      [--data-jsonl data/dev/data.jsonl] [--max-utts 200] [--repeats 2] [--threads N] \\
      [--out-json exp/bench_runtime.json] [--strict]
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from funasr_recipe.core.cli import program_parser
from funasr_recipe.core.env import available_cores

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = program_parser(__doc__)
    parser.add_argument("--exp-dir", type=Path, default=ROOT / "exp" / "tiny_sensevoice")
    parser.add_argument("--data-jsonl", type=Path, default=ROOT / "data" / "dev" / "data.jsonl")
    parser.add_argument("--max-utts", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=available_cores())
    parser.add_argument("--batch-sizes", default="1,8,32")
    parser.add_argument("--out-json", type=Path)
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is MISSED")
    args = parser.parse_args()
    needed = (args.exp_dir / "export" / "model.onnx", args.exp_dir / "final" / "model.pt", args.data_jsonl)
    for path in needed:
        if not path.is_file():
            sys.exit(f"{path} not found: run ./run.sh --stop-stage 4 (stages 0-4) for this model first")
    with tempfile.TemporaryDirectory(prefix="bench_runtime.") as tmp:
        exp = Path(tmp) / args.exp_dir.name  # the report's tag is the exp dir's name
        exp.mkdir()
        (exp / "export").symlink_to((args.exp_dir / "export").resolve())
        rc = subprocess.run([sys.executable, "-m", "local.bench_runtime", "--exp-dir", str(exp),
                             "--model-dir", str(args.exp_dir / "final"), "--data-jsonl", str(args.data_jsonl),
                             "--max-utts", str(args.max_utts), "--repeats", str(args.repeats),
                             "--threads", str(args.threads), "--batch-sizes", args.batch_sizes, "--targets",
                             *(["--strict"] if args.strict else [])],
                            cwd=ROOT).returncode
        if args.out_json and (exp / "benchmark.json").is_file():
            args.out_json.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(exp / "benchmark.json", args.out_json)
    return rc


if __name__ == "__main__":
    sys.exit(main())
