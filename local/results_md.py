"""Stage 3's summary: every scored decode dir of an experiment in one RESULTS.md, ESPnet style
(funasr_recipe/scoring/results_md.py).

Reads  <exp-dir>/decode_*/result.json (local/score.py);
writes <exp-dir>/RESULTS.md (or --out); with --headline, prints one result's line for run.sh's summary.

  .venv/bin/python -m local.results_md --exp-dir exp/sensevoice_small
  .venv/bin/python -m local.results_md --headline exp/sensevoice_small/decode_dev/result.json
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from funasr_recipe.core.cli import program_parser, run_main
from funasr_recipe.core.log import setup_logging
from funasr_recipe.scoring.results_md import write_results_md

log = logging.getLogger(__name__)


def headline(result_json: Path) -> str:
    """``<model> on <set> (<n> utterances): WER x%, CER y%`` of one scored decode dir."""
    r = json.loads(result_json.read_text(encoding="utf-8"))
    return (f"{r['model']} on {r['set']} ({r['utterances']} utterances): WER {100 * r['wer']['rate']:.2f}%, "
            f"CER {100 * r['cer']['rate']:.2f}%")


def build_parser() -> argparse.ArgumentParser:
    """This program's options (its --help; the docs' reference is made from it)."""
    parser = program_parser(__doc__)
    parser.add_argument("--exp-dir", type=Path, help="experiment dir (exp/<tag>)")
    parser.add_argument("--headline", type=Path, help="print this result.json's line and exit")
    parser.add_argument("--out", type=Path, help="output file (default: <exp-dir>/RESULTS.md)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    setup_logging()
    if args.headline:
        return run_main(lambda: print(headline(args.headline)), log)
    if args.exp_dir is None:
        parser.error("--exp-dir is required")
    return run_main(lambda: log.info("wrote %s", write_results_md(args.exp_dir, args.out
                                                                 or args.exp_dir / "RESULTS.md")), log)


if __name__ == "__main__":
    sys.exit(main())
