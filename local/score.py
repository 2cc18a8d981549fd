"""Stage 3: score one decode dir (funasr_recipe/scoring/score.py): CER, WER, per-language error rates,
tag accuracy, alignments.

Reads  <dir>/{ref.txt,hyp.txt[,ref_tags.tsv,hyp_tags.tsv,decode.json]} (local/decode.py merge);
writes <dir>/{per_utt.txt,result.txt,result.json}.

  .venv/bin/python -m local.score --dir exp/sensevoice_small/decode_dev
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from funasr_recipe.core.cli import program_parser, run_main
from funasr_recipe.core.fmt import pct
from funasr_recipe.core.log import setup_logging
from funasr_recipe.scoring.score import score_dir

log = logging.getLogger(__name__)


def run(decode_dir: Path) -> None:
    res = score_dir(decode_dir)
    missing, empty = len(res["missing_hyp"]), len(res["empty_hyp"])
    log.info("%s: %s on %s, %d utt: CER %s, WER %s, primary %s (missing %d, empty %d, extra %d) -> %s",
             decode_dir, res["model"], res["set"], res["utterances"], pct(res["cer"]["rate"], "inf"),
             pct(res["wer"]["rate"], "inf"), pct(res["primary"]["rate"], "inf"), missing, empty,
             len(res["extra_hyp"]), decode_dir / "result.txt")
    if missing:
        log.warning("%d utterances have no hypothesis (failed decodes?), e.g. %s; scored as deletions",
                    missing, res["missing_hyp"][0])


def build_parser() -> argparse.ArgumentParser:
    """This program's options (its --help; the docs' reference is made from it)."""
    parser = program_parser(__doc__)
    parser.add_argument("--dir", type=Path, required=True, help="decode dir (exp/<tag>/decode_<set>)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging()
    return run_main(lambda: run(args.dir), log)


if __name__ == "__main__":
    sys.exit(main())
