"""Repository hygiene that review would otherwise have to catch: the layering of the code, ruff, file
sizes, shell syntax and lint, and the documented layout against the tree."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from funasr_recipe.core.imports import import_graph, imported_modules

ROOT = Path(__file__).resolve().parents[3]
MAX_LINES = 400  # STYLE: no file over ~400 lines; split by responsibility instead
PACKAGE = "funasr_recipe"
# The package's sub-packages, lowest first: each may import only from itself and those before it.
LAYERS = ("core", "families", "dist", "features", "data", "model", "train", "compat", "scoring", "runtime",
          "reports", "packaging", "serving")
PROGRAM_DIRS = ("local", "bench")  # every module there is a program (recipes/<corpus>/prepare.py too)
SHELL = ("run.sh", "path.sh", "setup.sh", "local/run_lib.sh", "local/run_options.sh", ".ci/run",
         "bench/gpu/prepare.sh", "bench/gpu/check.sh", "slurm/run.sbatch")


def tracked(*patterns: str) -> list[Path]:
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", *patterns],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [ROOT / p for p in out.splitlines() if (ROOT / p).is_file()]


def is_program(module: str) -> bool:
    """A module run as ``python -m``: a stage program, a benchmark, a corpus recipe's prepare."""
    parts = module.split(".")
    return (len(parts) == 2 and parts[0] in PROGRAM_DIRS and parts[1] != "__init__") or \
        (len(parts) == 3 and parts[0] == "recipes" and parts[2] == "prepare")


def layering_violations(root: Path) -> list[str]:
    """Every import of the tree at ``root`` that breaks the layering, as ``file: imports X (rule)``:
    in the package, none upward and none of programs, recipes, benchmarks or tests; in a program, none of
    another program; in recipes/, none of local/ or bench/."""
    found: dict[tuple[Path, str], str] = {}  # (file, what it reaches) -> the message, once each
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[0] not in (PACKAGE, *PROGRAM_DIRS, "recipes"):
            continue
        module = ".".join(rel.with_suffix("").parts)
        # ``from a.b import c`` yields a.b and a.b.c: every name is checked, each target reported once.
        for imported in sorted(imported_modules(path)):
            parts = imported.split(".")
            top = parts[0]
            if rel.parts[0] == PACKAGE:
                if top in ("local", "recipes", "bench", "tests"):
                    found.setdefault((rel, top), f"{rel}: imports {imported} (the package imports no "
                                     "program, recipe, benchmark or test)")
                elif top == PACKAGE and len(rel.parts) > 2 and len(parts) > 1 and parts[1] in LAYERS:
                    own, other = rel.parts[1], parts[1]
                    if LAYERS.index(other) > LAYERS.index(own):
                        found.setdefault((rel, other), f"{rel}: imports {imported} ({other} is a higher "
                                         f"layer than {own})")
            elif is_program(imported) and imported != module and is_program(module):
                found.setdefault((rel, imported), f"{rel}: imports {imported} (a program imports no other "
                                 "program)")
            elif rel.parts[0] == "recipes" and top in ("local", "bench"):
                found.setdefault((rel, top), f"{rel}: imports {imported} (recipes use the package, not "
                                 "programs)")
    return sorted(found.values())


def test_layering_holds() -> None:
    assert layering_violations(ROOT) == []


def test_layering_check_catches_planted_imports(tmp_path: Path) -> None:
    """The check itself: a copy of the tree with one upward import, one program importing a program, a
    recipe importing a program and the package importing a recipe; each is named, the clean copy is not."""
    for folder in (PACKAGE, "local", "recipes", "bench"):
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    assert layering_violations(tmp_path) == []
    plants = {f"{PACKAGE}/core/fmt.py": f"from {PACKAGE}.packaging.model_card import render",
              f"{PACKAGE}/data/tags.py": "from recipes.common import read_table",
              "local/score.py": "from local.decode import main as decode_main",
              "recipes/common.py": "import local.corpus_info"}
    for rel, line in plants.items():
        path = tmp_path / rel
        # Inside a function, where a lazy import hides: the check reads every import in the file.
        path.write_text(path.read_text() + f"\n\ndef _planted() -> None:\n    {line}\n")
    found = layering_violations(tmp_path)
    assert len(found) == len(plants), found
    assert any("core/fmt.py: imports funasr_recipe.packaging.model_card (packaging is a higher layer than "
               "core)" in f for f in found)
    assert any("data/tags.py: imports recipes.common (the package imports no program" in f for f in found)
    assert any("local/score.py: imports local.decode (a program imports no other" in f for f in found)
    assert any("recipes/common.py: imports local.corpus_info (recipes use the package" in f for f in found)


def import_cycles(root: Path) -> list[str]:
    """One cycle, as ``a -> b -> a``, of each group of the package's modules that import one another in a
    ring, counting the imports inside functions (a lazy import hides a cycle; it does not break it)."""
    graph = import_graph(root, PACKAGE)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = set()
            while (top := stack.pop()) != node:
                group.add(top)
            groups.append(group | {node})

    for node in sorted(graph):
        if node not in index:
            visit(node)
    cycles = []
    for group in groups:
        start = min(group)
        if len(group) == 1 and start not in graph.get(start, ()):
            continue
        paths, seen = [[start]], {start}  # the shortest way round from ``start``, within the group
        while paths:
            path = paths.pop(0)
            if start in graph[path[-1]]:
                cycles.append(" -> ".join([*path, start]))
                break
            for nxt in sorted(graph[path[-1]] & group - seen):
                seen.add(nxt)
                paths.append([*path, nxt])
    return sorted(cycles)


def test_no_import_cycles() -> None:
    assert import_cycles(ROOT) == []


def test_cycle_check_catches_planted_cycles(tmp_path: Path) -> None:
    """The check itself: a copy of the package with one cycle at module level and one closed by an import
    inside a function (data/validate.py already imports data/tags.py); each is named, the clean copy has
    none."""
    shutil.copytree(ROOT / PACKAGE, tmp_path / PACKAGE, ignore=shutil.ignore_patterns("__pycache__"))
    assert import_cycles(tmp_path) == []
    core, data = tmp_path / PACKAGE / "core", tmp_path / PACKAGE / "data"
    (core / "fmt.py").write_text((core / "fmt.py").read_text() + f"\nfrom {PACKAGE}.core import log\n")
    (core / "log.py").write_text((core / "log.py").read_text() + f"\nimport {PACKAGE}.core.fmt\n")
    lazy = f"\n\ndef _planted() -> None:\n    from {PACKAGE}.data.validate import x\n"
    (data / "tags.py").write_text((data / "tags.py").read_text() + lazy)
    found = import_cycles(tmp_path)
    assert len(found) == 2, found
    assert any("funasr_recipe.core.fmt" in f and "funasr_recipe.core.log" in f for f in found), found
    assert any("funasr_recipe.data.validate" in f and "funasr_recipe.data.tags" in f for f in found), found
    assert all(f.split(" -> ")[0] == f.split(" -> ")[-1] for f in found), found


def test_local_holds_only_what_run_sh_calls() -> None:
    """Kaldi's convention: local/ is the recipe's programs, each one run by run.sh."""
    driver = "".join(p.read_text() for p in (ROOT / "run.sh", *sorted((ROOT / "local").glob("run_*.sh"))))
    called = set(re.findall(r"-m local\.(\w+)", driver))
    programs = {p.stem for p in (ROOT / "local").glob("*.py") if p.stem != "__init__"}
    assert programs == called, {"never called": programs - called, "missing": called - programs}


def test_ruff_clean() -> None:
    res = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=ROOT,
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_no_file_over_400_lines() -> None:
    files = tracked("*.py", "*.sh") + [ROOT / "run.sh", ROOT / "path.sh", ROOT / ".ci" / "run"]
    big = {str(p.relative_to(ROOT)): n for p in set(files)
           if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not big, big


def test_shell_scripts_parse() -> None:
    for script in {*tracked("*.sh"), ROOT / "run.sh", ROOT / ".ci" / "run"}:
        res = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert res.returncode == 0, f"{script}: {res.stderr}"


def test_shell_scripts_pass_shellcheck() -> None:
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (setup.sh installs it when run as root: apt-get install "
                    "shellcheck)")
    assert {str(p.relative_to(ROOT)) for p in tracked("*.sh")} <= set(SHELL), "a new script: add it to SHELL"
    res = subprocess.run(["shellcheck", "-x", *SHELL], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_documented_layout_matches_the_tree() -> None:
    """The Layout section of docs/architecture.md names every top-level folder and every sub-package, and
    each name in it exists."""
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    layout = page.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    block = "\n".join(line for line in layout.splitlines() if line.startswith("    "))
    named = set(re.findall(r"^\s{4,}([\w.-]+/)", block, re.MULTILINE))
    folders = {f"{p.relative_to(ROOT).parts[0]}/" for p in tracked("*")
               if len(p.relative_to(ROOT).parts) > 1 and not p.relative_to(ROOT).parts[0].startswith(".")}
    subpackages = {f"{p.name}/" for p in (ROOT / PACKAGE).iterdir() if (p / "__init__.py").is_file()}
    assert folders <= named, f"not in the documented layout: {folders - named}"
    assert subpackages <= named, f"sub-packages not in the documented layout: {subpackages - named}"
    assert set(LAYERS) == {s.rstrip("/") for s in subpackages}
    assert named <= folders | subpackages, f"named but not in the tree: {named - folders - subpackages}"
