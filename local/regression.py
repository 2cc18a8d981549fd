"""Stage 3's regression gate (funasr_recipe/scoring/regression.py): the sets a fine-tune must not make worse.

check  Reads <model-dir>'s config and tokenizer and each regression set's <data-jsonl>; writes nothing.
       Exits 2 with the reason when the set is in a language the model does not know, so that the run
       stops before decoding a set whose figures would mean nothing.
gate   Reads <exp-dir>/decode_<set>_pretrained/result.json and <exp-dir>/decode_<set>/result.json of each
       set (local/score.py); writes <exp-dir>/regression.{json,md} and prints the table. Exits 1 naming
       each failing set and its figures when any error rate rose by more than --max-regression points,
       unless --fatal false, which only warns. It needs a fine-tune: a from-scratch run has no
       pretrained decode to compare with, which is an input error (exit 2).

  .venv/bin/python -m local.regression check --model-dir exp/x/pretrained \\
      --data-jsonl data/regress_zh/data.jsonl
  .venv/bin/python -m local.regression gate --exp-dir exp/x --sets regress_zh,regress_en \\
      --max-regression 1.0 --fatal true
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from pathlib import Path

from funasr_recipe.core.cli import StageFailed, program_parser, run_main, str2bool
from funasr_recipe.core.log import setup_logging
from funasr_recipe.scoring.regression import (
    check_language,
    failure_message,
    gate,
    load_pairs,
    table,
    write_report,
)

log = logging.getLogger(__name__)


def check(args: argparse.Namespace) -> None:
    for data_jsonl in args.data_jsonl:
        shares = check_language(args.model_dir, data_jsonl)
        log.info("%s: the model in %s knows its languages: %s", data_jsonl, args.model_dir,
                 ", ".join(f"{lang} ({s['utterances']} utt, {s['unk_share']:.1%} of characters unknown)"
                           for lang, s in shares.items()))


def run_gate(args: argparse.Namespace) -> None:
    sets = [s for s in re.split(r"[,\s]+", args.sets) if s]  # run.sh hands a space-separated list
    report = gate(load_pairs(args.exp_dir, sets), args.max_regression)
    doc = write_report(args.exp_dir, report)
    print("\n".join(table(doc)))
    log.info("regression gate: %s (limit %+g points) -> %s", doc["verdict"], args.max_regression,
             args.exp_dir / "regression.json")
    if report.passed:
        return
    if args.fatal:
        raise StageFailed(f"{failure_message(doc)}; pass --regression-fatal false to only warn")
    log.warning("%s (--regression-fatal false: not stopping)", failure_message(doc))


def build_parser() -> argparse.ArgumentParser:
    """This program's options (its --help; the docs' reference is made from it)."""
    parser = program_parser(__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("check", help="refuse a regression set in a language the model does not know")
    c.add_argument("--model-dir", type=Path, required=True, help="the model before fine-tuning (hub layout)")
    c.add_argument("--data-jsonl", type=Path, nargs="+", required=True,
                   help="each regression set's data.jsonl")
    g = sub.add_parser("gate", help="compare the pretrained and fine-tuned decodes of the regression sets")
    g.add_argument("--exp-dir", type=Path, required=True, help="experiment dir (exp/<tag>)")
    g.add_argument("--sets", required=True,
                   help="set names, comma- or space-separated (decode_<set>{,_pretrained})")
    g.add_argument("--max-regression", type=float, default=1.0,
                   help="largest allowed rise of the error rate, in absolute points")
    g.add_argument("--fatal", type=str2bool, default=True,
                   help="true: exit 1 when a set fails; false: only warn")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging()
    return run_main(lambda: check(args) if args.command == "check" else run_gate(args), log)


if __name__ == "__main__":
    sys.exit(main())
