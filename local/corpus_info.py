"""Print a field of data/corpus.json for run.sh (lists space-separated).

Reads <data-dir>/corpus.json (written by the corpus recipe in stage 0); writes the value to stdout.

  python -m local.corpus_info --data-dir data sets
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict
from pathlib import Path

from recipes.common import read_corpus_info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("field", help="a field of corpus.json, e.g. sets, train_set, test_sets, language")
    args = parser.parse_args(argv)
    path = args.data_dir / "corpus.json"
    if not path.is_file():
        print(f"{path} is missing: run stage 0 first (./run.sh --stage 0 --stop-stage 0)", file=sys.stderr)
        return 1
    info = asdict(read_corpus_info(args.data_dir))
    if args.field not in info:
        print(f"{path} has no field {args.field!r}; fields: {', '.join(info)}", file=sys.stderr)
        return 1
    value = info[args.field]
    print(" ".join(value) if isinstance(value, list) else value)
    return 0


if __name__ == "__main__":
    sys.exit(main())
