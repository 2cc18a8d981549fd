"""Print fields of data/corpus.json for run.sh: one line per field asked for, lists space-separated.

Reads <data-dir>/corpus.json (written by the corpus recipe in stage 0); writes the values to stdout.

  .venv/bin/python -m local.corpus_info --data-dir data sets
  .venv/bin/python -m local.corpus_info --data-dir data language emotion event itn   # four lines
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import asdict
from pathlib import Path

from funasr_recipe.core.cli import program_parser, run_main
from funasr_recipe.core.log import setup_logging
from funasr_recipe.core.rejections import BadInputError
from funasr_recipe.data.corpus import read_corpus_info

log = logging.getLogger(__name__)


def field_value(data_dir: Path, field: str) -> str:
    """The field as run.sh reads it: a list space-separated."""
    info = asdict(read_corpus_info(data_dir))
    if field not in info:
        raise BadInputError(f"{data_dir / 'corpus.json'} has no field {field!r}; fields: {', '.join(info)}")
    value = info[field]
    return " ".join(value) if isinstance(value, list) else str(value)


def build_parser() -> argparse.ArgumentParser:
    """This program's options (its --help; the docs' reference is made from it)."""
    parser = program_parser(__doc__)
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("fields", nargs="+",
                        help="fields of corpus.json, e.g. sets, train_set, test_sets, language")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging()
    return run_main(lambda: print("\n".join(field_value(args.data_dir, f) for f in args.fields)), log)


if __name__ == "__main__":
    sys.exit(main())
