"""mkdocs hook: the Reference pages, generated at build time from the programs' own ``--help``.

Reads  run.sh's and every ``local/`` program's help text (funasr_recipe/core/cli_reference.py);
writes nothing to disk: the pages reference/run_sh.md and reference/programs.md exist only in the build,
so they cannot drift from the code.

  .venv/bin/mkdocs build --strict    # mkdocs.yml names this file under hooks:
"""

from __future__ import annotations

import sys
from pathlib import Path

from mkdocs.structure.files import File, Files

REPO = Path(__file__).resolve().parents[2]


WIDE = "---\nhide:\n  - navigation\n  - toc\n---\n\n"  # the help texts are 100 columns wide


def _fenced(text: str) -> str:
    return "```text\n" + text.rstrip("\n") + "\n```\n"


def on_files(files: Files, config) -> Files:  # noqa: ANN001  (mkdocs' own hook signature)
    sys.path.insert(0, str(REPO))
    from funasr_recipe.core.cli_reference import program_helps, run_sh_help

    run_sh = (WIDE + "# run.sh\n\nEvery option of run.sh, grouped by stage, with its default as it "
              "resolves on the machine that built this page (`./run.sh --help` prints the same).\n\n"
              + _fenced(run_sh_help()))
    programs = [WIDE + "# Stage programs\n\nThe programs run.sh calls, one per stage step (`local/`), each "
                "with its own `--help`. Run them as `.venv/bin/python -m local.NAME`; run.sh passes them "
                "what they need, so calling one by hand is for a single step or a check.\n"]
    for name, text in sorted(program_helps().items()):
        programs += [f"\n## {name}\n\n", _fenced(text)]
    for uri, content in (("reference/run_sh.md", run_sh), ("reference/programs.md", "".join(programs))):
        files.append(File.generated(config, uri, content=content))
    return files
