"""Stage 2's node-local copy of the feature shards (run.sh --local-cache DIR), once per node before torchrun.

Copies what the training, validation and replay lists of <dump-dir> name into <cache-dir> in parallel
threads, checksummed, skipping what is current (funasr_recipe/data/local_cache.py), and prints the dump dir
stage 2 then reads: the cache's view of <dump-dir>, or <dump-dir> itself when the copy does not fit (a
warning names the sizes) or with --feats-type raw (the trainer reads audio, not shards).

Reads  <dump-dir>/<set>/data.jsonl and the shard files they name;
writes <cache-dir>/<dump name>-<hash>/ (copies, rewritten lists, links, sidecars, cache.json); the dump
       dir for stage 2 on stdout, the log (node and rank in each line) on stderr.

  .venv/bin/python -m local.local_cache --dump-dir dump --cache-dir /dev/shm/asr --sets "train dev"
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from funasr_recipe.core.cli import program_parser, run_main
from funasr_recipe.core.log import setup_logging
from funasr_recipe.data.local_cache import fill

log = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    """This program's options (its --help; the docs' reference is made from it)."""
    parser = program_parser(__doc__)
    parser.add_argument("--dump-dir", type=Path, required=True, help="the shared stage-1 dump dir")
    parser.add_argument("--cache-dir", type=Path, required=True, help="a node-local dir (NVMe, /dev/shm)")
    parser.add_argument("--sets", required=True, help="space-separated sets of --dump-dir stage 2 reads")
    parser.add_argument("--feats-type", choices=("fbank", "raw"), default="fbank")
    parser.add_argument("--threads", type=int, default=8, help="files copied (and checked) at once")
    parser.add_argument("--reserve-gib", type=float, default=1.0,
                        help="GiB the copy must leave free (/dev/shm is memory the DataLoader workers use)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging()

    def work() -> None:
        if args.feats_type == "raw":
            log.warning("--local-cache copies stage-1 features; --feats-type raw reads the audio: not used")
            print(args.dump_dir)
            return
        try:
            result = fill(args.dump_dir, args.cache_dir, args.sets.split(), threads=args.threads,
                          reserve_bytes=int(args.reserve_gib * (1 << 30)))
        except PermissionError as e:  # an OSError is no bad-input error of run_main's: name the option
            raise RuntimeError(f"--local-cache {args.cache_dir}: {e}") from None
        print(result.dump_dir)

    return run_main(work, log)


if __name__ == "__main__":
    sys.exit(main())
