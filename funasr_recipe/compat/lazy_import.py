"""funasr without its __init__'s import of every model: a decode, an export or a benchmark imports only the
funasr modules it uses (``install``, then ``register_config``), the classes and the registry still funasr's.

Why: funasr/__init__.py imports all of its ~430 modules (``import_submodules``) so that their
``@tables.register(...)`` decorators fill the registry, and with them scikit-learn and scipy.stats (the
speaker-diarization helpers funasr.auto.auto_model imports), transformers, fastapi and triton: 5.7-6.9 s
of every decoding process of the demo against 1.2 s of decoding. ``python -X importtime -c "import
funasr"`` on the shared 2-core machine: 32.8 s, of which torch 7.0, scikit-learn 5.2, transformers 2.2,
fastapi 1.2, triton 1.2; funasr.auto.auto_model took 6.8-7.1 s with the diarization import and 0.7-1.1 s
without it, the three modules a SenseVoice config names 0.3-0.5 s more (4 runs each, same conditions).
A stage-3 decoding process went from 11.2-12.0 s of CPU to 4.2-5.4 s, the same texts.

Reads funasr's installed sources (to find which module registers which name, without importing them);
changes ``sys.modules``:
``install``         puts funasr's package module in sys.modules made from its own import spec, without
                    running its __init__.py: its ``__path__`` is funasr's, so every ``funasr.x.y`` imported
                    afterwards is funasr's own module (the real classes, the one ``tables``). It gets what
                    __init__.py defines that others read: ``__version__``, the lazy ``AutoModel`` and
                    ``AutoFrontend``, HYDRA_FULL_ERROR=1.
``register_config`` then imports the modules that register a name the config gives, anywhere in it (a
                    ``tables.register("<table>", "<name>")`` in the module's source), so that AutoModel and
                    the model's constructor find them as after ``import funasr``. Where that cannot be
                    sure of giving the same class it runs funasr's own __init__ after all (``complete``):
                    a name two modules register (the full import's order decides which one wins:
                    ParaformerSANMDecoder is e_paraformer's, not paraformer's), or a class a build key
                    (model, encoder, tokenizer, ...) names that is still not registered.
While the lazy package imports funasr.auto, funasr.models.campplus.cluster_backend (scikit-learn) cannot be
imported: auto_model imports it in a ``try: ... except: pass`` for installs without scikit-learn, and needs
it only for ``spk_model`` (speaker diarization), which the recipe never passes. ``complete`` binds it back.

Only programs call ``install``, in ``if __name__ == "__main__"`` (stage 1's merge, stages 3 to 5), before
anything has imported funasr; a process that has (local/train.py: funasr's trainer reads the whole
registry; a test session) keeps the full import, and ``install`` does nothing there. ``install`` also
puts ``register_model_dir`` in model/model_dir.py's BEFORE_LOAD, so that ``load_automodel`` (a lower
layer, which may not import this one) registers a model dir's classes before AutoModel reads it.

  install(); register_config(OmegaConf.load("exp/x/final/config.yaml")); from funasr import AutoModel
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import re
import sys
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from types import ModuleType
from typing import Any

from funasr_recipe.model import model_dir as model_dirs

log = logging.getLogger(__name__)

LAZY_FLAG = "__funasr_recipe_lazy__"  # set on the package module while its __init__ has not run
# funasr/__init__.py's _LAZY_EXPORTS: the names it imports on first access.
EXPORTS = {"AutoModel": "funasr.auto.auto_model", "AutoFrontend": "funasr.auto.auto_frontend"}
DIARIZATION = "funasr.models.campplus.cluster_backend"
# Config keys whose value AutoModel or a model's constructor looks up in tables.<key>_classes.
BUILD_KEYS = ("model", "frontend", "tokenizer", "encoder", "decoder", "predictor", "specaug", "normalize",
              "joint_network", "stride_conv")
_REGISTER = re.compile(r"tables\.register\(\s*['\"](\w+)['\"]\s*,\s*['\"]([^'\"]+)['\"]\s*\)")


def is_lazy() -> bool:
    """Whether funasr is this module's package, its __init__ not run (its registry partial)."""
    return bool(getattr(sys.modules.get("funasr"), LAZY_FLAG, False))


def install() -> bool:
    """Put funasr's package in sys.modules without its __init__'s imports; True if it did (False when
    funasr is imported already, or not installed)."""
    if "funasr" in sys.modules:
        return False
    spec = importlib.util.find_spec("funasr")
    if spec is None or not spec.submodule_search_locations:
        return False
    package = importlib.util.module_from_spec(spec)  # __path__, __file__, __spec__; nothing executed
    root = Path(next(iter(spec.submodule_search_locations)))
    package.__version__ = (root / "version.txt").read_text(encoding="utf-8").strip()
    package.__getattr__ = _export  # PEP 562, as funasr's own __getattr__
    setattr(package, LAZY_FLAG, True)
    os.environ["HYDRA_FULL_ERROR"] = "1"  # what funasr's __init__ sets
    sys.modules["funasr"] = package
    if register_model_dir not in model_dirs.BEFORE_LOAD:
        model_dirs.BEFORE_LOAD.append(register_model_dir)
    return True


def _export(name: str) -> Any:
    """funasr.AutoModel / funasr.AutoFrontend on first access, as funasr's __init__ gives them."""
    if name not in EXPORTS:
        raise AttributeError(f"module 'funasr' has no attribute {name!r}")
    with _without_diarization():
        value = getattr(importlib.import_module(EXPORTS[name]), name)
    setattr(sys.modules["funasr"], name, value)
    return value


@contextmanager
def _without_diarization() -> Iterator[None]:
    """While open and funasr is lazy, importing the diarization backend fails (ImportError)."""
    block = is_lazy() and DIARIZATION not in sys.modules
    if block:
        sys.modules[DIARIZATION] = None  # type: ignore[assignment]  # the import system's "not importable"
    try:
        yield
    finally:
        if block and sys.modules.get(DIARIZATION, 0) is None:
            del sys.modules[DIARIZATION]


@lru_cache(maxsize=1)
def registry_index() -> dict[str, dict[str, list[str]]]:
    """name -> table -> the funasr modules that register it there, in the order funasr's __init__ walks
    them, read from the sources (about 0.1 s)."""
    spec = importlib.util.find_spec("funasr")
    if spec is None or not spec.submodule_search_locations:
        return {}
    root = Path(next(iter(spec.submodule_search_locations)))
    index: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        if "tables.register" not in text:
            continue
        parts = path.relative_to(root.parent).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        for table, name in _REGISTER.findall(text):
            if module not in index[name][table]:
                index[name][table].append(module)
    return {name: dict(tables) for name, tables in index.items()}


def config_strings(cfg: Any) -> set[str]:
    """Every string value in a config (mappings and lists, nested; comma lists split)."""
    if isinstance(cfg, str):
        return {part.strip() for part in cfg.split(",") if part.strip()}
    if isinstance(cfg, Mapping):
        return set().union(*(config_strings(v) for v in cfg.values()))
    if isinstance(cfg, Iterable) and not isinstance(cfg, bytes):
        return set().union(*(config_strings(v) for v in cfg))
    return set()


def register(names: Iterable[str]) -> list[str]:
    """Import the funasr modules that register ``names`` (in any table); returns them. Nothing to do with
    the full import; a name registered by more than one module completes it (module docstring)."""
    if not is_lazy():
        return []
    index = registry_index()
    found = {name: index[name] for name in names if name in index}
    if twice := sorted(name for name, tables in found.items() if any(len(m) > 1 for m in tables.values())):
        complete(f"{', '.join(twice)} registered by more than one funasr module")
        return []
    modules = sorted({m for tables in found.values() for mods in tables.values() for m in mods})
    for module in modules:
        with _without_diarization():
            importlib.import_module(module)
    return modules


def named_classes(cfg: Mapping) -> dict[str, type | None]:
    """``"<key>:<name>"`` -> the class the registry holds for each name a build key of the config gives
    (None where it holds none), as AutoModel and the model's constructor will look them up."""
    from funasr.register import tables

    out: dict[str, type | None] = {}
    for key in BUILD_KEYS:
        table = getattr(tables, f"{key}_classes", None)
        value = cfg.get(key)
        if table is None or not isinstance(value, str):
            continue
        for name in (n.strip() for n in value.split(",") if n.strip()):
            out[f"{key}:{name}"] = table.get(name)
    return out


def register_config(cfg: Mapping) -> list[str]:
    """Register every class a funasr config names (``register`` on its strings); when a build key's
    class is still not registered, the full import (``complete``). Returns the modules imported."""
    if not is_lazy():
        return []
    modules = register(config_strings(cfg))
    if is_lazy() and (missing := [k for k, cls in named_classes(cfg).items() if cls is None]):
        complete(f"{', '.join(missing)}: registered by no funasr module imported on its own")
    return modules


def register_model_dir(model_dir: Path) -> list[str]:
    """``register_config`` of a model dir's config.yaml, which AutoModel builds from (the full import for
    a dir without one: AutoModel then reads the hub's description, which names no class here)."""
    if not is_lazy():
        return []
    path = Path(model_dir) / "config.yaml"
    if not path.is_file():
        complete(f"{model_dir} has no config.yaml")
        return []
    from omegaconf import OmegaConf

    return register_config(OmegaConf.to_container(OmegaConf.load(path), resolve=False))


def complete(reason: str) -> None:
    """Run funasr's own __init__ in the lazy package: every module imported, the registry full, as
    ``import funasr`` leaves them."""
    package = sys.modules.get("funasr")
    if not is_lazy() or package is None:
        return
    log.info("importing all of funasr: %s", reason)
    delattr(package, LAZY_FLAG)
    del package.__getattr__
    package.__spec__.loader.exec_module(package)  # funasr/__init__.py itself
    _bind_diarization()


def _bind_diarization() -> None:
    """auto_model's ClusterBackend, where it was imported while the backend could not be."""
    auto_model: ModuleType | None = sys.modules.get("funasr.auto.auto_model")
    backend = sys.modules.get(DIARIZATION)
    if auto_model is not None and backend is not None and not hasattr(auto_model, "ClusterBackend"):
        auto_model.ClusterBackend = backend.ClusterBackend
