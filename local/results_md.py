"""Stage 3's summary: every scored decode dir of an experiment in one RESULTS.md, ESPnet style
(funasr_recipe/scoring/results_md.py).

Reads  <exp-dir>/decode_*/result.json (local/score.py);
writes <exp-dir>/RESULTS.md (or --out).

  python -m local.results_md --exp-dir exp/sensevoice_small
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from funasr_recipe.core.cli import run_main
from funasr_recipe.core.log import setup_logging
from funasr_recipe.scoring.results_md import write_results_md

log = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--exp-dir", type=Path, required=True, help="experiment dir (exp/<tag>)")
    parser.add_argument("--out", type=Path, help="output file (default: <exp-dir>/RESULTS.md)")
    args = parser.parse_args(argv)
    setup_logging()
    return run_main(lambda: log.info("wrote %s", write_results_md(args.exp_dir, args.out
                                                                 or args.exp_dir / "RESULTS.md")), log)


if __name__ == "__main__":
    sys.exit(main())
