"""A package's requirements pinned whole: the distributions its code imports and every distribution
those require, each at the version the recipe tested (constraints.txt).

Pinning only what is imported left pip to choose the rest at install time (starlette and pydantic
floated under fastapi), so a package installed a month later ran code nobody had tested. Reads the
installed distributions' metadata and constraints.txt; writes nothing.

  pinned(["fastapi", "numpy"], constraints)   # ["annotated-types==0.8.0", "anyio==4.16.0", ...]
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

from funasr_recipe.core.rejections import BadInputError


def normalized(name: str) -> str:
    """A distribution's name as PEP 503 compares them (funasr_onnx = funasr-onnx = Funasr.ONNX)."""
    return re.sub(r"[-_.]+", "-", name.strip().lower())


def read_pins(constraints: Path) -> dict[str, tuple[str, str]]:
    """normalized name -> (name as written, version) of each ``name==version`` line."""
    pins = {}
    for line in constraints.read_text(encoding="utf-8").splitlines():
        name, sep, version = line.split("#")[0].partition("==")
        if sep:
            pins[normalized(name)] = (name.strip(), version.strip())
    return pins


def closure(names: Iterable[str]) -> set[str]:
    """The normalized names of ``names`` and of every distribution they require on this platform (the
    requirements' markers evaluated here, extras not followed), from the installed metadata."""
    seen: set[str] = set()
    todo = [normalized(n) for n in names]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            raise BadInputError(f"{name} is required but not installed: run ./setup.sh") from None
        for spec in requires:
            req = Requirement(spec)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(normalized(req.name))
    return seen


def pinned(names: Iterable[str], constraints: Path) -> list[str]:
    """``name==version`` for the closure of ``names``, sorted; BadInputError for a distribution that
    constraints.txt does not pin (it was not tested)."""
    pins = read_pins(constraints)
    needed = closure(names)
    missing = sorted(needed - set(pins))
    if missing:
        raise BadInputError(f"{constraints}: no tested version of {', '.join(missing)}")
    return sorted((f"{pins[n][0]}=={pins[n][1]}" for n in needed), key=str.lower)
