"""Stage 2's communication profile (funasr_recipe/dist/comm_profile.py): prints the ``export`` lines
for run.sh to evaluate, and logs every variable in force with where its value came from.

Reads the environment; writes the export lines to stdout, the table to the log (stderr).

  eval "$(.venv/bin/python -m local.comm_env --profile ethernet --socket-ifname eth0)"
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from funasr_recipe.core.cli import program_parser, run_main
from funasr_recipe.core.log import setup_logging
from funasr_recipe.dist.comm_profile import PROFILES, exports, profile, resolve

log = logging.getLogger(__name__)
# Shown whatever the profile, so the log says what NCCL and torch ran with.
ALWAYS_SHOWN = ("NCCL_SOCKET_IFNAME", "NCCL_IB_DISABLE", "NCCL_DEBUG", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
                "DEEPSPEED_TIMEOUT", "NCCL_ALGO", "NCCL_PROTO")


def run(args: argparse.Namespace) -> None:
    variables = profile(args.profile, args.socket_ifname, args.ib_hca)
    chosen = {v.name: (v, applies) for v, applies in resolve(variables, os.environ)}
    log.info("communication profile %s; variables in force:", args.profile)
    for name in dict.fromkeys([*chosen, *ALWAYS_SHOWN]):
        if name in chosen:
            var, applies = chosen[name]
            value, source = ((var.value, f"profile: {var.why}") if applies
                             else (os.environ[name], "yours, kept"))
        else:
            value, source = (os.environ.get(name, "(unset)"),
                             "environment" if name in os.environ else "default")
        log.info("  %s=%s  (%s)", name, value, source)
    lines = exports(variables, os.environ)
    if lines:
        print("\n".join(lines))


def build_parser() -> argparse.ArgumentParser:
    """This program's options (its --help; the docs' reference is made from it)."""
    parser = program_parser(__doc__)
    parser.add_argument("--profile", choices=PROFILES, default="default")
    parser.add_argument("--socket-ifname", default="",
                        help="NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME, e.g. ib0, eth0")
    parser.add_argument("--ib-hca", default="", help="NCCL_IB_HCA, e.g. mlx5_0,mlx5_1 (infiniband)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    setup_logging()
    return run_main(lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
