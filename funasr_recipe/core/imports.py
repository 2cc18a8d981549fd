"""Static import graph of the repository's Python files, read from their syntax trees (nothing runs).

Used to ship exactly the modules a stage-5 package's runtime needs (packaging/package.py) and to check
the layering of the package and that its modules import one another without a cycle
(tests/unit/repo/test_style.py).

  imported_modules(Path("funasr_recipe/runtime/onnx_asr.py"))  # {"numpy", "funasr_recipe.core.env", ...}
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def imported_modules(path: Path) -> set[str]:
    """Absolute module names a file imports anywhere in it (functions included): ``import a.b`` gives
    ``a.b``, ``from a.b import c`` gives ``a.b`` and ``a.b.c`` (c may be a module or a name)."""
    tree = ast.parse(Path(path).read_text(encoding="utf-8"), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def import_graph(root: Path, prefix: str) -> dict[str, set[str]]:
    """Module -> the modules under ``prefix`` it imports anywhere in its file (functions included), for
    every module of the package ``prefix`` at ``root`` (a package's __init__.py is the package).
    ``from a.b import c`` is the module a.b.c when that is a module, else a.b; relative imports resolve
    against the importing module."""
    graph: dict[str, set[str]] = {}
    for path in sorted((root / prefix).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        is_init = parts[-1] == "__init__"
        module = ".".join(parts[:-1] if is_init else parts)
        package = module if is_init else module.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.add(sub if module_file(root, sub) is not None else base)
        graph[module] = {t for t in targets
                         if (t == prefix or t.startswith(prefix + ".")) and module_file(root, t) is not None}
    return graph


def module_file(root: Path, module: str) -> Path | None:
    """The file of a module of the repository at ``root`` (a package's __init__.py), or None."""
    base = root.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def local_closure(root: Path, module: str, prefix: str) -> list[Path]:
    """Files of ``module`` and of every module under ``prefix`` it imports, directly or not, with the
    ``__init__.py`` of each package on the way: what a copy of the module needs to run. Sorted."""
    files: set[Path] = set()
    todo = [module]
    while todo:
        path = module_file(root, todo.pop())
        if path is None or path in files:
            continue
        files.add(path)
        todo += [m for m in imported_modules(path) if m == prefix or m.startswith(prefix + ".")]
        parts = path.relative_to(root).parts
        for depth in range(1, len(parts)):
            init = root.joinpath(*parts[:depth], "__init__.py")
            if init.is_file():
                files.add(init)
    return sorted(files)


def third_party(files: list[Path], local_prefix: str) -> set[str]:
    """Top-level names of the modules the files import that are neither the standard library's nor
    under ``local_prefix``."""
    names = {m.split(".")[0] for f in files for m in imported_modules(f)}
    return {n for n in names if n not in sys.stdlib_module_names and n != local_prefix and n != "__future__"}
