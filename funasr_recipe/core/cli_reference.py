"""The command-line reference, taken from the programs themselves so that it cannot drift from them:
run.sh's --help (made from the commented option block at the top of run.sh, under its headings, each
default as it resolves here) and the --help of every stage program in local/ and of each of its
sub-commands.

Reads  run.sh and local/*.py by running them with --help (subprocesses, in parallel; nothing else runs);
writes nothing (``python -m`` prints the reference as markdown).

  from funasr_recipe.core.cli_reference import program_helps, reference_markdown, run_sh_help
  .venv/bin/python -m funasr_recipe.core.cli_reference > /tmp/reference.md
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROGRAM_DIR = "local"  # the stage programs run.sh calls, each ``python -m local.<name>``
HELP_COLUMNS = 100  # the width argparse wraps to, whatever the terminal of the docs build
# Node variables of a job's environment: the reference shows where a default comes from, not the value
# the machine building the docs happens to have.
NODE_ENV = ("NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT")
# A sub-command group in argparse's usage line: "{check,gate} ..." (a positional with choices has no "...").
SUBCOMMANDS = re.compile(r"\{([\w,-]+)\} \.\.\.")


def reference_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment the --help texts are made in: ``env`` (default: this process's) less the node and
    Slurm variables, with a fixed width and the repository importable."""
    base = dict(os.environ if env is None else env)
    clean = {k: v for k, v in base.items() if k not in NODE_ENV and not k.startswith("SLURM_")}
    pythonpath = os.pathsep.join(p for p in (str(ROOT), clean.get("PYTHONPATH", "")) if p)
    return {**clean, "COLUMNS": str(HELP_COLUMNS), "PYTHONPATH": pythonpath}


def run_sh_help(env: Mapping[str, str] | None = None) -> str:
    """``./run.sh --help``: the options grouped by stage, each with its default as it resolves in ``env``
    (default: this environment less the node variables, so that a default from NNODES shows its
    fallback and where it comes from)."""
    return _help(["bash", str(ROOT / "run.sh"), "--help"], env).replace(str(ROOT / "run.sh"), "./run.sh")


def programs() -> list[str]:
    """The stage programs, as ``python -m`` names them: local.average, local.decode, ..."""
    return sorted(f"{PROGRAM_DIR}.{path.stem}" for path in (ROOT / PROGRAM_DIR).glob("*.py")
                  if path.stem != "__init__")


def program_helps(python: str | None = None, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """{command: its --help}, for every stage program (``local.decode``) and each of its sub-commands,
    nested ones too (``local.marker node``), in that order. ``python``: the interpreter (default: the
    repository's .venv, else this one)."""
    python = python or _default_python()
    helps: dict[str, str] = {}
    level = programs()
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        while level:
            texts = pool.map(lambda cmd: _help([python, "-m", *cmd.split(), "--help"], env), level)
            nxt = []
            for command, text in zip(level, texts, strict=True):
                helps[command] = text
                nxt += [f"{command} {sub}" for sub in subcommands(text)]
            level = nxt
    return {command: helps[command] for command in sorted(helps)}


def subcommands(help_text: str) -> list[str]:
    """The sub-commands a --help's usage line offers (argparse's "{a,b} ..."), in its order."""
    usage = help_text.split("\n\n", 1)[0]
    found = SUBCOMMANDS.search(usage)
    return found.group(1).split(",") if found else []


def reference_markdown(python: str | None = None) -> str:
    """The reference as one markdown page: run.sh's --help, then each program's."""
    parts = ["# Command-line reference", "",
             "Made from the programs' own `--help` (funasr_recipe/core/cli_reference.py); defaults as they "
             "resolve on the machine that built this page.", "",
             "## ./run.sh", "", "```text", run_sh_help().rstrip(), "```", ""]
    for command, text in program_helps(python).items():
        parts += [f"## python -m {command}", "", "```text", text.rstrip(), "```", ""]
    return "\n".join(parts)


def _default_python() -> str:
    venv = ROOT / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def _help(argv: list[str], env: Mapping[str, str] | None) -> str:
    res = subprocess.run(argv, cwd=ROOT, env=reference_env(env), capture_output=True, text=True, timeout=300)
    if res.returncode != 0 or not res.stdout.strip():
        raise RuntimeError(f"{' '.join(argv)} exited {res.returncode}: {res.stderr.strip()[-2000:]}")
    return res.stdout


if __name__ == "__main__":
    print(reference_markdown())
