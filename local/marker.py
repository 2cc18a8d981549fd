"""run.sh's side of the marker system (funasr_recipe/dist/markers.py): fingerprints, ``.done`` markers,
waiting for node 0, node check-in; what stage 0 read (data/sources.py); the nodes' heartbeats and outcomes
during training (dist/node_status.py). The stage programs use the same modules from Python.

Reads and writes only the marker, listing and node files named on the command line; prints a fingerprint,
or what changed, or why training failed.

  .venv/bin/python -m local.marker fingerprint [--files F ...] [--contents F ...] [--markers M ...] \\
      -- PART ...
  .venv/bin/python -m local.marker check data/.done FP   # exit 0 if the marker holds FP, else 1 (as test(1))
  .venv/bin/python -m local.marker write data/.done FP
  .venv/bin/python -m local.marker wait data/.done FP --what "stage 0" --timeout 7200
  .venv/bin/python -m local.marker check-in exp/x/.nodes FP --node-rank 1 --nnodes 4 --timeout 7200
  .venv/bin/python -m local.marker sources write data     # after stage 0: what it read
  .venv/bin/python -m local.marker sources check data     # exit 0 if unchanged, else 1 and what changed
  .venv/bin/python -m local.marker node heartbeat exp/x/.nodes FP --node-rank 1 --parent $$  # until $$ ends
  .venv/bin/python -m local.marker node outcome exp/x/.nodes FP --node-rank 1 --ok true
  .venv/bin/python -m local.marker node wait-peers exp/x/.nodes FP --node-rank 0 --nnodes 2 --timeout 600
  .venv/bin/python -m local.marker node explain exp/x/.nodes FP --node-rank 0 --nnodes 2 \\
      --log exp/x/train.log --master 10.0.0.1:29500
  .venv/bin/python -m local.marker resume exp/x --config C --ds-config J --dump-marker dump/.done \\
      --world-size 2 --train-opts "--train-set train ..." [--pretrained-dir D] [--restart true] -- ++overrides
      # stage 2: may it train in exp/x (train/resume_guard.py)? exit 2 naming what differs
"""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
from pathlib import Path

from funasr_recipe.core.cli import EXIT_FAILURE, program_parser, run_main, split_overrides, str2bool
from funasr_recipe.core.log import setup_logging
from funasr_recipe.data import sources
from funasr_recipe.dist import node_status
from funasr_recipe.dist.checkin import check_in
from funasr_recipe.dist.markers import fingerprint, is_done, mark_done, read_fingerprint, wait_for_marker
from funasr_recipe.dist.train_failure import explain

log = logging.getLogger(__name__)


def marker_fingerprints(markers: list[Path]) -> list[str]:
    """The fingerprint each marker holds; FileNotFoundError for a missing one (that stage has not run)."""
    found = [read_fingerprint(m) for m in markers]
    if missing := [str(m) for m, fp in zip(markers, found, strict=True) if fp is None]:
        raise FileNotFoundError(f"{', '.join(missing)} missing: run the stage that writes it first")
    return [fp for fp in found if fp is not None]


def _sources(action: str, data_dir: Path) -> int:
    if action == "write":
        log.info("stage 0 read the files listed in %s", sources.write_listing(data_dir))
        return 0
    if changes := sources.compare(data_dir):
        for line in changes:
            log.info("since stage 0 last ran: %s", line)
        return EXIT_FAILURE
    return 0


def _node(args: argparse.Namespace) -> int:
    nodes, fp, rank = args.nodes_dir, args.fingerprint, args.node_rank
    if args.action == "heartbeat":
        node_status.start(nodes, rank)
        node_status.heartbeat(nodes, fp, rank, args.parent)
    elif args.action == "outcome":
        node_status.set_outcome(nodes, fp, rank, args.ok)
    elif args.action == "wait-peers":
        node_status.wait_for_peers(nodes, fp, rank, args.nnodes, args.timeout)
    else:
        for line in explain(nodes, fp, args.nnodes, rank, args.log, args.master, args.watch):
            log.error("%s", line)
    return 0


# Training options that do not shape the model, or whose content the identity holds instead of the path.
NOT_IDENTITY = frozenset({"exp-dir", "strict", "config", "ds-config", "pretrained-dir"})
# Of those, the ones recorded by name (never compared): what results call the run (model/provenance.py).
GIVEN = ("config", "pretrained-dir", "exp-dir")


def _resume(args: argparse.Namespace, overrides: list[str]) -> int:
    from funasr_recipe.train import resume_guard  # omegaconf: not for the many other marker commands

    words = shlex.split(args.train_opts)
    given = {words[i].lstrip("-"): words[i + 1] for i in range(0, len(words) - 1, 2)}
    options = {name: value for name, value in given.items() if name not in NOT_IDENTITY}
    options["world-size"] = str(args.world_size)
    new = resume_guard.identity(args.config, overrides, args.ds_config, options, args.dump_marker,
                                args.pretrained_dir, {name: given[name] for name in GIVEN if name in given})
    if args.node_rank != 0:  # node 0 decides and moves; the others only refuse what node 0 will refuse
        if not args.restart:
            resume_guard.check(args.exp_dir, new, restart=False)
        return 0
    outcome = resume_guard.check(args.exp_dir, new, restart=args.restart)
    if outcome == "resume":
        log.info("resuming %s: trained with the same settings", args.exp_dir)
    resume_guard.record(args.exp_dir, new)
    return 0


def build_parser() -> argparse.ArgumentParser:
    """This program's options (its --help; the docs' reference is made from it)."""
    parser = program_parser(__doc__)
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
    src = sub.add_parser("sources", help="what stage 0 read: write its listing, or check it is unchanged")
    src.add_argument("action", choices=("write", "check"))
    src.add_argument("data_dir", type=Path)
    node = sub.add_parser("node", help="this node's heartbeat and outcome during training; the peers' state")
    node.add_argument("action", choices=("heartbeat", "outcome", "wait-peers", "explain"))
    node.add_argument("nodes_dir", type=Path)
    node.add_argument("fingerprint")
    node.add_argument("--node-rank", type=int, required=True)
    node.add_argument("--nnodes", type=int, default=1)
    node.add_argument("--parent", type=int, help="heartbeat: beat while this process lives")
    node.add_argument("--ok", type=str2bool, default=False, help="outcome: true if training succeeded here")
    node.add_argument("--timeout", type=float, default=600, help="wait-peers: seconds")
    node.add_argument("--log", type=Path, help="explain: this node's training log")
    node.add_argument("--master", default="", help="explain: master address:port, for the message")
    node.add_argument("--watch", type=float, default=15.0, help="explain: seconds to watch the peers")
    resume = sub.add_parser("resume",
                            help="stage 2: refuse to continue checkpoints made under other settings")
    resume.add_argument("exp_dir", type=Path)
    resume.add_argument("--config", type=Path, required=True)
    resume.add_argument("--ds-config", type=Path, help="its content, when training with DeepSpeed")
    resume.add_argument("--dump-marker", type=Path, required=True, help="stage 1's .done (data, tokenizer)")
    resume.add_argument("--pretrained-dir", type=Path)
    resume.add_argument("--train-opts", default="", help="local/train.py's options, shell-quoted")
    resume.add_argument("--world-size", type=int, required=True,
                        help="processes in all (the batches depend on it)")
    resume.add_argument("--node-rank", type=int, default=0)
    resume.add_argument("--restart", type=str2bool, default=False,
                        help="move the old run to <exp-dir>/superseded/<time>/ and start over")
    return parser


def main(argv: list[str] | None = None) -> int:
    own, parts = split_overrides(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(own)
    setup_logging()
    if args.command == "resume":
        return run_main(lambda: _resume(args, parts), log)
    if args.command == "sources":
        return run_main(lambda: _sources(args.action, args.data_dir), log)
    if args.command == "node":
        return run_main(lambda: _node(args), log)
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
