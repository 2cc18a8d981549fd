"""run.sh's side of the marker system (funasr_recipe/dist/markers.py): fingerprints, ``.done`` markers,
waiting for node 0, node check-in. The stage programs use the same module from Python.

Reads and writes only the marker and check-in files named on the command line; prints a fingerprint.

  python -m local.marker fingerprint [--files F ...] [--contents F ...] [--markers M ...] -- PART ...
  python -m local.marker check data/.done FP      # exit 0 if the marker holds FP, else 1 (as test(1))
  python -m local.marker write data/.done FP
  python -m local.marker wait data/.done FP --what "stage 0" --timeout 7200
  python -m local.marker check-in exp/x/.nodes FP --node-rank 1 --nnodes 4 --timeout 7200
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from funasr_recipe.core.cli import run_main, split_overrides
from funasr_recipe.core.log import setup_logging
from funasr_recipe.dist.checkin import check_in
from funasr_recipe.dist.markers import fingerprint, is_done, mark_done, read_fingerprint, wait_for_marker

log = logging.getLogger(__name__)


def marker_fingerprints(markers: list[Path]) -> list[str]:
    """The fingerprint each marker holds; FileNotFoundError for a missing one (that stage has not run)."""
    found = [read_fingerprint(m) for m in markers]
    if missing := [str(m) for m, fp in zip(markers, found, strict=True) if fp is None]:
        raise FileNotFoundError(f"{', '.join(missing)} missing: run the stage that writes it first")
    return [fp for fp in found if fp is not None]


def main(argv: list[str] | None = None) -> int:
    own, parts = split_overrides(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    fp = sub.add_parser("fingerprint", help="print the fingerprint of the parts after -- and of files")
    fp.add_argument("--files", type=Path, nargs="*", default=[], help="by path, size and mtime")
    fp.add_argument("--contents", type=Path, nargs="*", default=[], help="by their bytes (absent is allowed)")
    fp.add_argument("--markers", type=Path, nargs="*", default=[],
                    help="the fingerprints these markers hold (the work this one is made from)")
    for name in ("check", "write", "wait"):
        p = sub.add_parser(name)
        p.add_argument("marker", type=Path)
        p.add_argument("fingerprint")
    waiting = sub.choices["wait"]
    waiting.add_argument("--what", required=True, help="what node 0 is doing, for the messages")
    waiting.add_argument("--timeout", type=float, required=True, help="seconds")
    checkin = sub.add_parser("check-in", help="write this node's check-in, wait for every node's")
    checkin.add_argument("nodes_dir", type=Path)
    checkin.add_argument("fingerprint")
    checkin.add_argument("--node-rank", type=int, required=True)
    checkin.add_argument("--nnodes", type=int, required=True)
    checkin.add_argument("--timeout", type=float, required=True, help="seconds")
    args = parser.parse_args(own)
    setup_logging()
    if args.command == "fingerprint":
        return run_main(lambda: print(fingerprint(*marker_fingerprints(args.markers), *parts,
                                                  files=args.files, contents=args.contents)), log)
    if args.command == "check":
        return 0 if is_done(args.marker, args.fingerprint) else 1
    if args.command == "write":
        return run_main(lambda: mark_done(args.marker, args.fingerprint), log)
    if args.command == "wait":
        return run_main(lambda: wait_for_marker(args.marker, args.fingerprint, args.what, args.timeout), log)
    return run_main(lambda: check_in(args.nodes_dir, args.fingerprint, args.node_rank, args.nnodes,
                                     args.timeout), log)


if __name__ == "__main__":
    sys.exit(main())
