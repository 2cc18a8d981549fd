"""The command-line reference (core/cli_reference.py) and what makes it complete: every stage program's
--help shows every default (core/cli.py HelpFormatter), run.sh's shows its options by stage with their
defaults expanded (local/run_options.sh)."""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from funasr_recipe.core.cli import HelpFormatter, program_parser, shown_default
from funasr_recipe.core.cli_reference import ROOT, program_helps, programs, run_sh_help, subcommands


def entries(help_text: str) -> dict[str, str]:
    """{option string: its entry in the --help} (the invocation line and the help lines under it)."""
    found: dict[str, str] = {}
    current: list[str] = []
    for line in help_text.splitlines():
        if re.match(r"  -", line) or not line.startswith("    "):
            current = [line]
            for opt in re.findall(r"(?:^|, )(--?[\w-]+)", line.strip()):
                found[opt] = line
        else:
            current.append(line)
        for opt in re.findall(r"(?:^|, )(--?[\w-]+)", current[0].strip()):
            found[opt] = "\n".join(current)
    return found


def parsers_of(parser: argparse.ArgumentParser, name: str) -> dict[str, argparse.ArgumentParser]:
    """{command: parser} of a program and of each of its sub-commands, nested ones too."""
    out = {name: parser}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, subparser in action.choices.items():
                out.update(parsers_of(subparser, f"{name} {sub}"))
    return out


def test_help_shows_defaults_as_typed_and_says_none_where_there_is_none() -> None:
    parser = program_parser("doc")
    parser.add_argument("--flag", type=lambda s: s == "true", default=False, help="a boolean option")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 8, 32], help="batch sizes")
    parser.add_argument("--empty", default="", help="nothing by default")
    parser.add_argument("--unset", help="no default")
    parser.add_argument("--bare", type=int, default=7)  # no help: argparse alone would print nothing
    parser.add_argument("--rank", type=int, default=3, help="global rank (default: $RANK)")
    parser.add_argument("--percent", default="5%", help="a share of the speakers")
    parser.add_argument("--long-dir", default="dump/tokenizer", help="x " * 30)
    parser.add_argument("--required", required=True, default="x", help="must be given")
    parser.add_argument("--verbose", action="store_true", help="say more")
    parser.add_argument("positional", help="a positional")
    assert parser.formatter_class is HelpFormatter
    found = entries(parser.format_help())
    assert "(default: false)" in found["--flag"]
    assert "(default: 1 8 32)" in found["--sizes"]
    assert '(default: "")' in found["--empty"]
    assert "(default" not in found["--unset"]
    assert "(default: 7)" in found["--bare"]
    assert found["--rank"].count("(default") == 1 and "$RANK" in found["--rank"]  # the help's own words win
    assert "(default: 5%)" in found["--percent"]
    assert "(default: dump/tokenizer)" in found["--long-dir"]  # wrapped as one piece
    assert "(default" not in found["--required"] and "(default" not in found["--verbose"]
    assert shown_default(parser._actions[-1]) is None


def test_every_stage_program_builds_its_parser_and_shows_every_default() -> None:
    """Each local/ program exposes build_parser() with the recipe's formatter, and the --help of it and of
    each sub-command names the default of every option that has one."""
    assert len(programs()) == len(list((ROOT / "local").glob("*.py"))) - 1  # every one but __init__
    missing = []
    for program in programs():
        module = importlib.import_module(program)
        assert hasattr(module, "build_parser"), f"{program} has no build_parser()"
        for command, parser in parsers_of(module.build_parser(), program).items():
            assert issubclass(parser.formatter_class, HelpFormatter), command
            found = entries(parser.format_help())
            for action in parser._actions:
                if shown_default(action) is not None:
                    text = found[action.option_strings[-1]] if action.option_strings else parser.format_help()
                    if "(default" not in text:
                        missing.append(f"{command} {action.option_strings}")
    assert missing == []


def test_subcommands_are_read_from_the_usage_line() -> None:
    assert subcommands("usage: python -m local.marker [-h] {fingerprint,check,check-in} ...\n\nx") == \
        ["fingerprint", "check", "check-in"]
    # A positional with choices is no sub-command: the program's one help covers it.
    assert subcommands("usage: python -m local.decode [-h] {work,merge}\n\n...") == []


def _run_sh_options() -> list[str]:
    block = (ROOT / "run.sh").read_text().split("# ---- options", 1)[1].split("# ---- end of options", 1)[0]
    return [m.replace("_", "-") for m in re.findall(r"^([a-z_]+)=", block, re.MULTILINE)]


def test_run_sh_help_groups_every_option_under_a_stage_and_expands_its_default() -> None:
    text = run_sh_help(env={**os.environ, "NNODES": "3"})
    found = entries(text)
    options = _run_sh_options()
    assert len(options) > 40
    for name in options:
        assert text.count(f"  --{name} ") == 1, name
        assert "[default: " in found[f"--{name}"], name
    assert "${" not in text, "a default shown unexpanded"
    # Under headings: the first option comes after the first one, and each stage of the pipeline has one.
    head, first = text.split(f"  --{options[0]} ", 1)
    assert re.search(r"^\S.*:$", head.split("Options (", 1)[1], re.MULTILINE)
    for heading in ("Stage 0:", "Stage 1:", "Stage 2:", "Stage 3:", "Stage 6:", "Fine-tuning", "Cluster"):
        assert re.search(rf"^{heading}.*:$", text, re.MULTILINE), heading
    # Only NNODES came through (run_sh_help drops the node variables of the caller's environment) ...
    assert "[default: 1 ($NNODES, else $SLURM_NNODES, else 1)]" in " ".join(found["--nnodes"].split())
    assert "[default: 29500 ($MASTER_PORT, else 29500)]" in " ".join(found["--master-port"].split())
    # ... and run.sh's own --help shows the value the environment gives, and where it came from.
    res = subprocess.run(["./run.sh", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                         env={**os.environ, "NNODES": "3", "SLURM_NODEID": "2"})
    help_here = " ".join(res.stdout.split())
    assert "number of nodes [default: 3 ($NNODES, else $SLURM_NNODES, else 1)]" in help_here
    assert "[default: 2 ($NODE_RANK, else $SLURM_NODEID, else 0)]" in help_here
    cores = subprocess.run(["env", "-u", "OMP_NUM_THREADS", "-u", "OMP_THREAD_LIMIT", "nproc"],
                           capture_output=True, text=True, check=True).stdout.strip()
    assert f"[default: {cores} (the CPU cores of this machine)]" in " ".join(found["--nj"].split())
    assert '[default: "0.9 1.0 1.1"]' in " ".join(found["--speed-perturb"].split())
    assert '[default: ""]' in found["--exp-dir"]


@pytest.mark.slow  # every --help in a subprocess: 32 of them, 12 s (5 s of CPU) on the loaded 2 cores
def test_program_helps_cover_every_program_and_sub_command() -> None:
    helps = program_helps()
    assert set(programs()) <= set(helps)
    assert {"local.marker node", "local.marker check-in", "local.regression gate"} <= set(helps)
    for command, text in helps.items():
        assert text.startswith(f"usage: python -m {command} "), command
    assert "(default: 8000)" in entries(helps["local.serve"])["--port"]
    assert Path(ROOT / "local" / "serve.py").is_file()


def test_usage_lines_run_from_a_fresh_clone() -> None:
    """The usage lines of the programs' docstrings (their --help, hence the docs' reference) name the
    repository's interpreter: a bare ``python`` is the system's, without torch, until path.sh is sourced.
    bench/gpu/ is left out: check.sh runs it under its own PYTHON."""
    bare = []
    for folder in ("local", "bench", "recipes", "funasr_recipe"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "gpu" in path.relative_to(ROOT).parts:
                continue
            doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
            bare += [f"{path.relative_to(ROOT)}: {line.strip()}" for line in doc.splitlines()
                     if re.match(r"\s+(eval \"\$\()?python3? -m (local|bench|recipes)\.", line)]
    assert bare == []


def test_no_program_imports_torch_before_its_options_are_read() -> None:
    """--help (and the docs' reference) start in tenths of a second: torch, funasr and DeepSpeed are
    imported where the work starts, after the options."""
    code = ("import importlib, json, sys\n"
            f"for name in {programs()!r}:\n"
            "    importlib.import_module(name)\n"
            "print(json.dumps(sorted(m for m in ('torch', 'funasr', 'deepspeed') if m in sys.modules)))")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         check=True)
    assert json.loads(res.stdout) == []
