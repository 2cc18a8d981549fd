"""Benchmark the checksum stage 1 records per shard (features/shard_sums.py) against the alternatives.

Writes one file of random bytes (--size-gib, 1 GiB by default) in a temporary folder (or --work-dir),
then reads it whole once per method, in --chunk-mib blocks, single-threaded, best of --repeat:

  read only            the reads alone: what any check costs at least
  shard_sums.file_sum  the recipe's own check (crc32 into one reused buffer)
  crc32, adler32       zlib's, in chunks
  sha1, sha256, md5, blake2b   hashlib's (OpenSSL's sha1/sha256 use the CPU's SHA extensions when it has them)

The file was just written, so its reads come from the page cache: the figures are the CPU's cost. From a
disk or a network filesystem the read itself is usually slower than crc32, and the check costs little
more than the read. For each method it prints GB/s, seconds per GB (10^9 bytes) and the ratio of its
time to the read alone, by the wall clock and in CPU seconds (user + system: on a machine other
processes share, the wall clock measures them too); it asserts nothing about time. The file is removed
at the end.

  .venv/bin/python -m bench.bench_shard_sums [--size-gib 1] [--out-json exp/bench_shard_sums.json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path

from funasr_recipe.core.cli import program_parser, run_main
from funasr_recipe.core.log import Progress, setup_logging
from funasr_recipe.features.shard_sums import file_sum

log = logging.getLogger(__name__)


def write_random(path: Path, size: int) -> None:
    """``size`` random bytes (64 MiB of os.urandom, repeated: incompressible enough for a checksum)."""
    block = os.urandom(64 << 20)
    progress = Progress(f"writing {path}", -(-size >> 20), unit="MiB", logger=log)
    with open(path, "wb") as f:
        left = size
        while left > 0:
            n = min(left, len(block))
            f.write(block[:n])
            left -= n
            progress.update(n >> 20)
    progress.close()


def streamed(update: Callable[[memoryview], None], chunk: int) -> Callable[[Path], None]:
    """A reader of a whole file into one reused buffer, handing each block to ``update``."""
    def run(path: Path) -> None:
        view = memoryview(bytearray(chunk))
        with open(path, "rb", buffering=0) as f:
            while n := f.readinto(view):
                update(view[:n])
    return run


def methods(chunk: int) -> dict[str, Callable[[Path], None]]:
    def zlib_sum(fn: Callable[[bytes, int], int]) -> Callable[[Path], None]:
        def run(path: Path) -> None:
            value = 0

            def update(block: memoryview) -> None:
                nonlocal value
                value = fn(block, value)
            streamed(update, chunk)(path)
        return run

    def hashlib_sum(name: str) -> Callable[[Path], None]:
        def run(path: Path) -> None:
            streamed(hashlib.new(name).update, chunk)(path)
        return run

    out: dict[str, Callable[[Path], None]] = {
        "read only": streamed(lambda block: None, chunk),
        "shard_sums.file_sum (crc32)": file_sum,
        "zlib.crc32": zlib_sum(zlib.crc32),
        "zlib.adler32": zlib_sum(zlib.adler32),
    }
    out.update({f"hashlib.{name}": hashlib_sum(name) for name in ("sha1", "sha256", "md5", "blake2b")})
    return out


def time_best(run: Callable[[Path], None], path: Path, repeat: int) -> tuple[float, float]:
    """The best wall-clock and the best CPU seconds (user + system) of ``repeat`` runs."""
    wall = cpu = float("inf")
    for _ in range(repeat):
        start, start_cpu = time.perf_counter(), time.process_time()
        run(path)
        wall, cpu = min(wall, time.perf_counter() - start), min(cpu, time.process_time() - start_cpu)
    return wall, cpu


def bench(args: argparse.Namespace) -> None:
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="bench_shard_sums."))
    work.mkdir(parents=True, exist_ok=True)
    path = work / "shard.bin"
    size = int(args.size_gib * (1 << 30))
    try:
        write_random(path, size)
        table = methods(args.chunk_mib << 20)
        time_best(table["read only"], path, 1)  # the first read after the write: page cache settled
        seconds = {}
        for name, run in table.items():
            seconds[name] = time_best(run, path, args.repeat)
            log.info("%s: %.3f s wall, %.3f s CPU", name, *seconds[name])
    finally:
        path.unlink(missing_ok=True)
        if args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    gb = size / 1e9
    read_wall, read_cpu = seconds["read only"]
    rows = {name: {"GB_per_s": round(gb / wall, 3), "s_per_GB": round(wall / gb, 4),
                   "x_read": round(wall / read_wall, 2), "cpu_s_per_GB": round(cpu / gb, 4),
                   "cpu_x_read": round(cpu / read_cpu, 2)} for name, (wall, cpu) in seconds.items()}
    print(f"{size / (1 << 30):.2f} GiB from the page cache, {args.chunk_mib} MiB chunks, one thread, "
          f"best of {args.repeat}; CPU seconds are the figure to trust on a shared machine")
    print(f"{'method':<30}{'GB/s':>8}{'s per GB':>10}{'x read':>8}{'CPU s/GB':>10}{'CPU x read':>12}")
    for name, row in rows.items():
        print(f"{name:<30}{row['GB_per_s']:>8.2f}{row['s_per_GB']:>10.3f}{row['x_read']:>8.2f}"
              f"{row['cpu_s_per_GB']:>10.3f}{row['cpu_x_read']:>12.2f}")
    crc = rows["shard_sums.file_sum (crc32)"]
    print(f"checking stage 1's shards (crc32) costs {crc['s_per_GB']:.3f} s per GB here "
          f"({crc['cpu_s_per_GB']:.3f} CPU s), {crc['x_read']:.2f}x reading them "
          f"({crc['cpu_x_read']:.2f}x in CPU time)")
    if args.out_json:
        args.out_json.parent.mkdir(parents=True, exist_ok=True)
        summary = {"bytes": size, "chunk_mib": args.chunk_mib, "repeat": args.repeat, "methods": rows}
        args.out_json.write_text(json.dumps(summary, indent=1) + "\n")


def main() -> int:
    parser = program_parser(__doc__)
    parser.add_argument("--size-gib", type=float, default=1.0, help="size of the file hashed")
    parser.add_argument("--chunk-mib", type=int, default=8, help="bytes per read")
    parser.add_argument("--repeat", type=int, default=2, help="reads per method; the best is kept")
    parser.add_argument("--work-dir", type=Path, help="where the file is written (default: a temporary dir)")
    parser.add_argument("--out-json", type=Path)
    args = parser.parse_args()
    setup_logging()
    return run_main(lambda: bench(args), log)


if __name__ == "__main__":
    raise SystemExit(main())
