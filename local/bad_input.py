"""How stages report bad input (one ``Rejection`` per entry, in ``rejected.tsv`` or as a fatal error),
and the command-line helpers every stage program shares.

Every stage that drops an utterance says where it came from (file, line, key) and why, so that
entries in = accepted + rejected at every stage, and ``--strict true`` turns the first one fatal.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from dataclasses import dataclass

REJECTED_HEADER = "file\tline\tkey\treason\tdetail\n"


class BadInputError(Exception):
    """Raised in strict mode for the first bad entry: ``<file>:<line>: <key>: <reason>: <detail>``."""


@dataclass
class Rejection:
    file: str
    line: int | None
    key: str
    reason: str
    detail: str

    def tsv(self) -> str:
        detail = self.detail.replace("\t", " ").replace("\n", " ")
        return f"{self.file}\t{'' if self.line is None else self.line}\t{self.key}\t{self.reason}\t{detail}\n"

    def message(self) -> str:
        line = "" if self.line is None else self.line
        return f"{self.file}:{line}: {self.key}: {self.reason}: {self.detail}"


def split_overrides(argv: list[str]) -> tuple[list[str], list[str]]:
    """(the program's own options, the Hydra overrides after ``--``) of a stage program's command line.

    Split by hand: argparse treats a lone trailing ``--`` with nothing after it as an error.
    """
    split = argv.index("--") if "--" in argv else len(argv)
    return argv[:split], argv[split + 1:]


def str2bool(value: str) -> bool:
    """Kaldi-style boolean option value (true/false)."""
    if value.lower() in ("true", "1", "yes"):
        return True
    if value.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


def run_stage(run: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """``run(args)``'s exit code; bad input (a missing file, a wrong value, an unsupported model)
    is logged as one line and gives 2, without a traceback."""
    try:
        return run(args)
    except (FileNotFoundError, ValueError, NotImplementedError) as e:
        logging.getLogger(run.__module__).error("%s", e)
        return 2
