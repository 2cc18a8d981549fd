"""The command-line conventions of every program (``local/``, ``recipes/``, ``bench/``).

Exit codes, one convention for all:
  0  done;
  1  failure: the work ran and did not give a usable result (an export that breaks parity, a node that
     never arrived, a process that crashed);
  2  bad input or usage: a missing or malformed file, a wrong option value, a model the stage does not
     support, or, with ``--strict true``, the first bad utterance. The message says what to fix.
argparse's own usage errors exit 2 too. ``run_main`` maps exceptions to these codes and logs one line
without a traceback. Bad input is only what the code names so: ``core/rejections.BadInputError`` (raised
where input is validated; the package's own validation errors subclass it) and FileNotFoundError /
NotADirectoryError. Any other exception, a ValueError from numpy or torch, a TypeError, is a bug: it
keeps Python's traceback and exit status 1. With RECIPE_DEBUG=1 in the environment, bad input and
failures are logged with their traceback too (``DEBUG_ENV``; run.sh --help and the README say so).
"""

from __future__ import annotations

import argparse
import copy
import logging
import os
import re
import sys
import textwrap
from collections.abc import Callable
from typing import Any

from funasr_recipe.core.rejections import BadInputError

EXIT_OK, EXIT_FAILURE, EXIT_BAD_INPUT = 0, 1, 2
# Only these are the user's fault; a bare ValueError or NotImplementedError is not (it may come from a
# library), so it stays a bug with its traceback.
BAD_INPUT: tuple[type[Exception], ...] = (BadInputError, FileNotFoundError, NotADirectoryError)
FAILURE: tuple[type[Exception], ...] = (RuntimeError, TimeoutError)
DEBUG_ENV = "RECIPE_DEBUG"  # =1: log bad input and failures with their traceback
# The epilog of a program's --help (recipes/common.recipe_parser's; run.sh's --help says the same).
EXIT_CODES_HELP = ("exit status: 0 done, 1 failure (or a bug: with a traceback), 2 bad input or usage "
                   f"(one line; {DEBUG_ENV}=1 shows its traceback)")


def program_parser(description: str | None, **kwargs: Any) -> argparse.ArgumentParser:
    """The parser of a program (``local/``, ``bench/``): its docstring as the description, kept as written,
    every option's default in its help (``HelpFormatter``), the exit codes (with RECIPE_DEBUG) under the
    options, and ``python -m <module>`` as the program's name in its usage line. ``kwargs`` go to
    ArgumentParser."""
    settings = {"prog": program_name(), "description": description, "epilog": EXIT_CODES_HELP,
                "formatter_class": HelpFormatter}
    parser = argparse.ArgumentParser(**{**settings, **kwargs})
    parser.register("action", "parsers", _SubCommands)
    return parser


def program_name() -> str | None:
    """``python -m local.decode`` for a program run as a module, else None (argparse's own: the script's
    file name): what the user typed, not ``decode.py``."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return f"python -m {spec.name}" if spec is not None and spec.name else None


NBSP = "\u00a0"


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The description kept as written, and ``(default: X)`` after the help of every option that has a
    default (``shown_default``), unless its help already says "(default" (a default that depends on the
    run, such as ``$RANK``, says where it comes from in words)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        shown = shown_default(action)
        if shown is None or "(default" in text:
            return text
        # Joined by no-break spaces, so that wrapping does not split it unless it is long (_split_lines).
        default = f"(default: {shown.replace('%', '%%')})"
        return f"{text} {default.replace(' ', NBSP) if len(default) <= 40 else default}".lstrip()

    def _split_lines(self, text: str, width: int) -> list[str]:
        # Not at hyphens: "--dump-dir" and "exp-dir/x" stay whole; nor at the no-break spaces.
        text = re.sub(r"[ \t\n\r\f\v]+", " ", text).strip()
        return [line.replace(NBSP, " ") for line in textwrap.wrap(text, width, break_on_hyphens=False)]

    def _format_action(self, action: argparse.Action) -> str:
        if not action.help and shown_default(action) is not None:  # argparse prints no help line at all
            action = copy.copy(action)
            action.help = self._get_help_string(action)
        return super()._format_action(action)


class _SubCommands(argparse._SubParsersAction):
    """add_subparsers' action: its sub-commands' --help shows their defaults too (argparse gives a
    sub-command the plain formatter), and theirs in turn."""

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        kwargs.setdefault("formatter_class", HelpFormatter)
        parser = super().add_parser(name, **kwargs)
        parser.register("action", "parsers", _SubCommands)
        return parser


def shown_default(action: argparse.Action) -> str | None:
    """An option's default as its --help shows it: as typed on a command line (true/false, lists space
    separated, "" for the empty string); None for a flag without a value, a required option or positional,
    and a default of None (nothing is passed on)."""
    value = action.default
    if value is None or value is argparse.SUPPRESS or action.nargs == 0 or action.required:
        return None
    if not action.option_strings and action.nargs not in ("?", "*"):
        return None
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return " ".join(str(v) for v in value) or '""'
    return str(value) if str(value) else '""'


class StageFailed(RuntimeError):
    """The work ran to the end and its result must not be used (exit 1); the message says why."""


def run_main(work: Callable[[], int | None], log: logging.Logger | None = None) -> int:
    """``work()``'s exit code (None counts as 0), with bad input -> 2 and failures -> 1, each logged as
    one line at the caller's file:line."""
    log = log or logging.getLogger()
    try:
        rc = work()
    except BAD_INPUT as e:
        log.error("%s", e, stacklevel=2, exc_info=_debug())
        return EXIT_BAD_INPUT
    except FAILURE as e:
        if isinstance(e, NotImplementedError):  # a RuntimeError, but a library's: a bug, not a failure
            raise
        log.error("%s", e, stacklevel=2, exc_info=_debug())
        return EXIT_FAILURE
    return EXIT_OK if rc is None else rc


def _debug() -> bool:
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


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


def env_rank(default: int = 0) -> int:
    """This process's global rank as run.sh and torchrun set it ($RANK)."""
    return int(os.environ.get("RANK", default))


def add_shard_work_options(parser: argparse.ArgumentParser) -> None:
    """The options of a program whose ``work`` mode decodes this rank's share of a set and whose ``merge``
    gathers every rank's (local/decode.py, local/pseudo_label.py); ``check_shard_work_options`` after
    parsing."""
    parser.add_argument("--world-size", type=int, default=1, help="processes of all nodes together")
    parser.add_argument("--rank", type=int, default=env_rank(),
                        help="work: global rank, 0..world-size-1 (default: $RANK)")
    parser.add_argument("--device", default="cpu",
                        help="work: cpu, cuda (the node's GPU number $LOCAL_RANK) or cuda:<i>")
    parser.add_argument("--batch-size", type=int, default=32, help="work: utterances per batch at most")
    parser.add_argument("--batch-frames", type=int, default=30000,
                        help="work: padded 10 ms frames per batch at most (longest x utterances)")
    parser.add_argument("--wait-timeout", type=float, default=7200, help="merge: seconds to wait for ranks "
                        "(local/decode.py work: for --after's marker)")


def check_shard_work_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``--device cuda`` made this node's GPU (``cuda:$LOCAL_RANK``); a rank outside the world is a usage
    error."""
    if args.device == "cuda":
        args.device = f"cuda:{os.environ.get('LOCAL_RANK', 0)}"
    if not 0 <= args.rank < args.world_size:
        parser.error(f"--rank {args.rank} is not in 0..{args.world_size - 1}")
