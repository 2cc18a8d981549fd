"""Benchmark batch samplers on real utterance lengths: padding, batches, order across epochs, steps per rank.

Reads ``source_len`` (10 ms frames) from the training set's data.jsonl: the repo's
data/train/data.jsonl (the bundled digit corpus; ``./run.sh --stage 0 --stop-stage 0`` writes it in a
few seconds), and speechocean762's train part when ../shared/data/speechocean762 is there (prepared
with the recipe's own stage-0 programs into a temporary folder), or the files given with --data.
Writes nothing.

For each corpus, world size (1 and 2; ranks are simulated: funasr's sampler reads them from
torch.distributed, which the bench patches) and sampler -- funasr's default ``BatchSampler``,
``LengthBucketBatchSampler`` and the latter with --jitter -- it builds epochs 0 and 1 on every rank
with the same dataset_conf (batch_type token, --batch-size frames per rank, sort_size 1024) and prints:

  pad %        padded frames / all frames in the batches of epoch 0 (max length x size, summed)
  batches      batches of epoch 0, all ranks together
  steps/rank   batches each rank gets in epoch 0 (min-max over ranks)
  floor %      the least padding any split of the length-sorted corpus into that many batches
               within the same budget can have (dynamic programming): what no sampler can beat
  seen %       utterances yielded in epoch 0 / corpus size (below 100: dropped; above: repeated)
  same batches epoch 1 yields the same batches as epoch 0 on rank 0, in the same order
  same order   epoch 1's sequence of (batch size, longest utterance) per step equals epoch 0's on rank 0

  .venv/bin/python -m bench.bench_batching [--batch-size 6000] [--data path/data.jsonl ...]
"""

from __future__ import annotations

import functools
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import torch.distributed as dist
from funasr.register import tables

import funasr_recipe.data.batch_sampler  # noqa: F401  (registers LengthBucketBatchSampler)
from funasr_recipe.core.cli import program_parser
from funasr_recipe.data.batching import SourceLengths

ROOT = Path(__file__).resolve().parents[1]
SPEECHOCEAN = ROOT.parent / "shared" / "data" / "speechocean762"


def default_corpora(tmp: Path) -> dict[str, Path]:
    """The bundled corpus's training set, and speechocean762's when ../shared has it."""
    corpora = {}
    if (bundled := ROOT / "data" / "train" / "data.jsonl").is_file():
        corpora["digits (data/train)"] = bundled
    if SPEECHOCEAN.is_dir():
        # The recipe's own stage-0 programs, so that source_len is computed as training sees it.
        for cmd in (["recipes.speechocean762.prepare", "--corpus-dir", str(SPEECHOCEAN), "--data-dir",
                     str(tmp)], ["local.prepare_data", "--set-dir", str(tmp / "train")]):
            subprocess.run([sys.executable, "-m", *cmd], cwd=ROOT, check=True, capture_output=True)
        corpora["speechocean762 train"] = tmp / "train" / "data.jsonl"
    if not corpora:
        sys.exit("no lengths to read: run ./run.sh --stage 0 --stop-stage 0 first, or pass --data")
    return corpora


@functools.cache
def padding_floor(lengths: tuple[int, ...], batch_size: int, n_batches: int, max_utts: int = 200) -> float:
    """Least padded fraction over all splits of the sorted lengths into ``n_batches`` contiguous batches
    with longest x size <= batch_size and size <= max_utts (contiguous splits of the sorted list are
    optimal: exchanging two utterances across batches never lowers either batch's longest)."""
    sorted_lengths = np.sort(np.asarray(lengths, dtype=np.float64))
    n = len(sorted_lengths)
    best = np.full(n + 1, np.inf)
    best[0] = 0.0
    for _ in range(n_batches):
        nxt = np.full(n + 1, np.inf)
        for end in range(1, n + 1):
            start = np.arange(max(0, end - max_utts), end)
            area = sorted_lengths[end - 1] * (end - start)
            cost = np.where(area <= batch_size, best[start] + area, np.inf)
            nxt[end] = cost.min()
        best = nxt
    return 100.0 * (1.0 - sorted_lengths.sum() / best[n]) if np.isfinite(best[n]) else float("nan")


def epoch_batches(make: Callable[..., dict[str, Any]], ds: SourceLengths, conf: dict[str, Any], rank: int,
                  world: int, epoch: int) -> list[list[int]]:
    """One rank's batches of one epoch, built as funasr's DataloaderMapStyle.build_iter builds them."""
    with mock.patch.object(dist, "get_rank", return_value=rank), \
            mock.patch.object(dist, "get_world_size", return_value=world):
        sampler = make(ds, start_step=0, rank=rank, world_size=world, **conf)["batch_sampler"]
        sampler.set_epoch(epoch)
        return list(sampler)


def measure(make: Callable[..., dict[str, Any]], lengths: list[int], conf: dict[str, Any],
            world: int) -> dict[str, Any]:
    ds = SourceLengths(lengths)
    e0 = [epoch_batches(make, ds, conf, r, world, 0) for r in range(world)]
    e1_rank0 = epoch_batches(make, ds, conf, 0, world, 1)
    flat = [b for rank in e0 for b in rank]
    padded = sum(max(lengths[i] for i in b) * len(b) for b in flat)
    real = sum(lengths[i] for b in flat for i in b)

    def profile(batches: list[list[int]]) -> list[tuple[int, int]]:
        return [(len(b), max(lengths[i] for i in b)) for b in batches]

    steps = [len(r) for r in e0]
    return {"pad": 100.0 * (1 - real / padded), "batches": len(flat),
            "floor": padding_floor(tuple(lengths), conf["batch_size"], len(flat)),
            "steps": f"{min(steps)}-{max(steps)}" if min(steps) != max(steps) else str(steps[0]),
            "seen": 100.0 * sum(len(b) for b in flat) / len(lengths),
            "same_batches": e1_rank0 == e0[0], "same_order": profile(e1_rank0) == profile(e0[0])}


def main() -> None:
    parser = program_parser(__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, action="append", help="data.jsonl to read (repeatable)")
    parser.add_argument("--batch-size", type=int, default=6000, help="padded frames per rank")
    parser.add_argument("--jitter", type=float, default=0.01, help="length_jitter of the third row")
    args = parser.parse_args()
    conf = {"batch_type": "token", "batch_size": args.batch_size, "sort_size": 1024, "shuffle": True,
            "num_workers": 0}
    samplers = [("funasr BatchSampler", "BatchSampler", {}),
                ("LengthBucket", "LengthBucketBatchSampler", {}),
                (f"LengthBucket jitter {args.jitter}", "LengthBucketBatchSampler",
                 {"length_jitter": args.jitter})]
    with tempfile.TemporaryDirectory() as tmp:
        corpora = ({p.parent.name + " " + p.name: p for p in args.data} if args.data
                   else default_corpora(Path(tmp)))
        lengths = {name: SourceLengths.from_manifest(path).lengths for name, path in corpora.items()}
    header = (f"{'corpus':<22} {'utts':>5} {'world':>5} {'sampler':<26} {'pad %':>6} {'batches':>7} "
              f"{'floor %':>7} {'steps/rank':>10} {'seen %':>6} {'same batches':>12} {'same order':>10}")
    print(f"batch_type token, batch_size {args.batch_size} frames per rank, sort_size 1024, "
          "epochs 0 and 1; 'same ...' compare rank 0's epoch 1 with its epoch 0")
    print(header)
    print("-" * len(header))
    for name, lens in lengths.items():
        for world in (1, 2):
            for label, table_name, extra in samplers:
                make = tables.batch_sampler_classes.get(table_name)
                r = measure(make, lens, {**conf, **extra}, world)
                print(f"{name:<22} {len(lens):>5} {world:>5} {label:<26} {r['pad']:>6.2f} {r['batches']:>7} "
                      f"{r['floor']:>7.2f} {r['steps']:>10} {r['seen']:>6.1f} {str(r['same_batches']):>12} "
                      f"{str(r['same_order']):>10}")


if __name__ == "__main__":
    main()
