"""Stage -1 (and the start of stage 2): the preflight across nodes, one process per node
(funasr_recipe/dist/preflight.py). Exits 0 when every node agrees with node 0 (the table and the
bandwidth test are logged), 1 naming each node and difference otherwise, on every node alike; 2 when
--master-addr does not resolve on this node (1 when the resolver fails or takes over 10 s).

Reads  the checkout, requirements, config and DeepSpeed files, data/ and dump/ (hashes), node 0's
       token in exp/ and dump/; writes (node 0) <exp-dir>/preflight.json.

  .venv/bin/python -m local.preflight --nnodes 2 --node-rank 0 --master-addr 10.0.0.1 --master-port 29500 \\
      --nproc-per-node 8 --device cuda --config conf/x.yaml --ds-config ds_configs/ds_stage1_bf16.json \\
      --exp-dir exp/x --options "--config conf/x.yaml -- ++train_conf.max_epoch=3"
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from funasr_recipe.core.cli import program_parser, run_main
from funasr_recipe.core.log import setup_logging
from funasr_recipe.dist.node_report import NodeInputs
from funasr_recipe.dist.preflight import PreflightSetup, run_preflight

log = logging.getLogger(__name__)
ROOT = Path(__file__).resolve().parent.parent


def build_parser() -> argparse.ArgumentParser:
    """This program's options (its --help; the docs' reference is made from it)."""
    parser = program_parser(__doc__)
    parser.add_argument("--nnodes", type=int, required=True)
    parser.add_argument("--node-rank", type=int, required=True)
    parser.add_argument("--master-addr", required=True)
    parser.add_argument("--master-port", type=int, required=True)
    parser.add_argument("--nproc-per-node", type=int, required=True)
    parser.add_argument("--device", choices=("cpu", "cuda"), required=True)
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--ds-config", type=Path, required=True)
    parser.add_argument("--data-dir", type=Path, default=Path("data"))
    parser.add_argument("--dump-dir", type=Path, default=Path("dump"))
    parser.add_argument("--exp-dir", type=Path, required=True)
    parser.add_argument("--options", default="", help="run.sh's options but --node-rank (they must agree)")
    parser.add_argument("--sizes-mib", default="1,16,64,256",
                        help="all-reduce sizes of the bandwidth test, MiB, comma-separated (empty: no test)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the other nodes")
    return parser


def run(args: argparse.Namespace) -> None:
    sizes = tuple(int(s) for s in args.sizes_mib.split(",") if s.strip())
    inputs = NodeInputs(root=ROOT, config=args.config, ds_config=args.ds_config, data_dir=args.data_dir,
                        dump_dir=args.dump_dir, exp_dir=args.exp_dir, options=args.options)
    setup = PreflightSetup(inputs=inputs, node_rank=args.node_rank, nnodes=args.nnodes,
                           master_addr=args.master_addr, master_port=args.master_port,
                           nproc_per_node=args.nproc_per_node, device=args.device, sizes_mib=sizes,
                           timeout=args.timeout)
    log.info("preflight: node %d of %d meets node 0 at %s:%d", args.node_rank, args.nnodes, args.master_addr,
             args.master_port)
    run_preflight(setup)  # PreflightFailed is a RuntimeError: exit 1 through run_main
    log.info("preflight passed: %d node(s) agree", args.nnodes)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    setup_logging()
    args.exp_dir.mkdir(parents=True, exist_ok=True)
    return run_main(lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
