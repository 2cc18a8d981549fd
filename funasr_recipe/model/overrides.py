"""Which config keys funasr (and the recipe) read, per section, with their types: what local/check_config.py
holds a run's Hydra overrides against (``++`` adds any key: ``++dataset_conf.batchsize=8000`` trained at the
config's batch size without a word). Read from the INSTALLED sources with ast, never imported (torch and
funasr take seconds): ``kwargs.get("k", default)``-like reads and ``__init__`` parameters, per section
  top level     funasr's train_ds, AutoModel, download_model, trainer methods, dataloader entry; the
                recipe's compat/, train/, model/config.py and model/trainer.py (its ``++key=``); the model
                class's keys (AutoModel passes the model every top-level key and model_conf);
  train_conf    ``Trainer.__init__`` of train_utils/trainer_ds.py and trainer.py;
  dataset_conf  all of funasr/datasets/** and funasr_recipe/data/** (datasets, index, samplers, loaders);
  optim_conf, scheduler_conf  the class funasr's optim_classes / scheduler_classes table (or the recipe's
                addition to it) gives the config's ``optim`` / ``scheduler``, torch's from torch's sources;
  <x>_conf      the class the config's ``<x>`` names (registered name or class name), without ``<x>`` the
                one the model's __init__ builds with ``**<x>_conf`` (ctc_conf: CTC);
  build_tokenizer  model/tokenizer.build_tokenizer's parameters (stage 1 passes it the section);
and in each section the ``kwargs["<section>"].get(k)``-like reads of the top-level files.

Reads those sources; reads and writes ~/.cache/funasr_recipe/config_keys.json ($XDG_CACHE_HOME), keyed by
funasr's version and the sources' mtimes (a scan costs about 0.6 s of CPU, a cached run nothing).

  Scan().fixed()["dataset_conf"]["batch_size"]                  # -> ["int", "0"]: type tag, default (JSON)
  Scan().named_class("encoder_classes", "SANMEncoder")           # its keys, or ANY (None): cannot tell
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

RECIPE = Path(__file__).resolve().parents[1]
ROOTS = frozenset({"kwargs", "conf", "cfg", "config"})  # receivers that hold a config or one of its sections
GETTERS = frozenset({"get", "pop", "setdefault"})
SEQUENCES = frozenset({"list", "List", "Sequence", "tuple", "Tuple", "Iterable"})
ANY = None  # a section whose keys cannot be told: every key is accepted there
Keys = dict[str, list]  # key -> [type tag or None, the default as JSON or None]


def _const(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _top(tree: ast.Module, kind: type, methods: bool = False) -> Iterator[Any]:
    """The module's top-level ``kind`` nodes (and, with ``methods``, its classes' methods)."""
    for node in tree.body:
        if isinstance(node, kind):
            yield node
        if methods and isinstance(node, ast.ClassDef):
            yield from (n for n in node.body if isinstance(n, kind))


def type_tag(value: Any) -> str | None:
    """The type of a config value: bool, int, float, list, dict, str or None (null, other)."""
    kinds = ((bool, "bool"), (int, "int"), (float, "float"), ((list, tuple), "list"), (dict, "dict"),
             (str, "str"))
    return next((tag for kind, tag in kinds if isinstance(value, kind)), None)


def _union(annotation: ast.AST) -> list[str]:
    """The type names of an annotation's members: ``Union[int, Sequence[int]]`` -> int, Sequence."""
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
        return _union(annotation.left) + _union(annotation.right)
    subscript = isinstance(annotation, ast.Subscript)
    name = ast.unparse(annotation.value if subscript else annotation).rsplit(".", 1)[-1]  # type: ignore
    if subscript and name in ("Union", "Optional"):
        inner = annotation.slice  # type: ignore[attr-defined]
        return [n for e in (inner.elts if isinstance(inner, ast.Tuple) else [inner]) for n in _union(e)]
    return [name]


def _typed(default: ast.AST | None, annotation: ast.AST | None = None) -> list:
    """[type tag, the default as JSON] of a parameter or ``get("k", default)``: "*" where the annotation
    allows a sequence and a scalar (``Union[int, Sequence[int]]``: either is right, nothing is checked)."""
    kinds = {"seq" if name in SEQUENCES else "scalar" if name in ("int", "float", "str") else ""
             for name in _union(annotation)} if annotation else set()
    if {"seq", "scalar"} <= kinds:
        return ["*", None]
    try:
        value = ast.literal_eval(default) if default is not None else None
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return [None, None]
    if (tag := type_tag(value)) is not None:
        return [tag, json.dumps(value)]
    plain = annotation.id if isinstance(annotation, ast.Name) else None
    return [plain if plain in ("bool", "int", "float") else None, None]


def merge_keys(into: Keys, more: Keys | None) -> None:
    """Add ``more`` to ``into``; a key read with other types in two places: a float wins over an int, an
    unknown type (no default) is no disagreement, any other disagreement leaves the key unchecked ("*")."""
    for key, info in (more or {}).items():
        old = into.setdefault(key, info)
        tags = {old[0], info[0]} - {None}
        if len(tags) > 1:
            into[key] = next((i for i in (old, info) if i[0] == "float"), None) if tags == {"int", "float"} \
                else ["*", None]
        elif old[0] is None:
            into[key] = info


class _Scope:
    """The config reads of one function: ``kwargs.get("k", default)``, ``kwargs["s"]["k"]``,
    ``(kwargs.get("s") or {}).get("k")``, through names bound to such reads, and ``"++s.k=..."`` strings."""

    def __init__(self, fn: ast.AST, root: tuple[str, ...]) -> None:
        self.root, self.env = root, {}
        kwarg = getattr(getattr(fn, "args", None), "kwarg", None)
        self.roots = ROOTS | ({kwarg.arg} if kwarg else set())
        self.reads: dict[tuple[str, ...], Keys] = {}
        nodes = list(ast.walk(fn))
        for node in nodes:
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and \
                    (path := self.path(node.value)) is not None:
                self.env[node.targets[0].id] = path
        for node in nodes:
            if isinstance(node, ast.Call | ast.Subscript):
                self.path(node, record=True)
            elif isinstance(node, ast.Constant) and str(node.value).startswith("++"):
                self._record(tuple(node.value[2:].split("=", 1)[0].split(".")), None)  # hydra_argv's own

    def _record(self, path: tuple[str, ...], default: ast.AST | None) -> None:
        if 1 <= len(path) <= 2:
            merge_keys(self.reads.setdefault(path[:-1], {}), {path[-1]: _typed(default)})

    def path(self, node: ast.AST, record: bool = False) -> tuple[str, ...] | None:
        if isinstance(node, ast.Name):
            if node.id in self.env or node.id in self.roots:
                return self.env.get(node.id, self.root)
            return (node.id,) if node.id.endswith("_conf") else None
        if isinstance(node, ast.Attribute):
            return self.root if isinstance(node.value, ast.Name) and node.value.id == "self" and \
                node.attr in ROOTS else None
        if isinstance(node, ast.BoolOp):
            return self.path(node.values[0])
        key, base, default = None, None, None
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and (key := _const(node.slice)):
            base = self.path(node.value)
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr in GETTERS and (key := _const(node.args[0])):
                base, default = self.path(func.value), node.args[1] if len(node.args) > 1 else None
            elif (isinstance(func, ast.Name) and func.id in ("dict", "deepcopy")) or \
                    (isinstance(func, ast.Attribute) and func.attr == "deepcopy"):
                return self.path(node.args[0])
        if base is None or key is None:
            return None
        if record:
            self._record(base + (key,), default)
        return base + (key,)


class Scan:
    """The keys funasr and the recipe read, from their sources, each result cached (module docstring)."""

    def __init__(self, cache: Path | None = None) -> None:
        specs = {n: importlib.util.find_spec(n) for n in ("funasr", "torch")}  # found, not imported
        self.pkgs = {n: Path(next(iter(s.submodule_search_locations))) for n, s in specs.items()
                     if s and s.submodule_search_locations} | {"funasr_recipe": RECIPE}
        self.trees: dict[Path, ast.Module] = {}
        self.texts: dict[Path, str] = {}
        root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        self.cache_file = cache or root / "funasr_recipe" / "config_keys.json"
        self.stamp = self._stamp()
        self.entries: dict[str, Any] = {}
        self.dirty = False
        try:  # a missing, unreadable or stale cache: scanned again
            stored = json.loads(self.cache_file.read_text(encoding="utf-8"))
            self.entries = stored["entries"] if stored["stamp"] == self.stamp else {}
        except (OSError, ValueError, KeyError, TypeError):
            pass

    def text(self, file: Path) -> str:
        if file not in self.texts:
            self.texts[file] = file.read_text(encoding="utf-8", errors="replace")
        return self.texts[file]

    def _files(self, *dirs: str) -> list[Path]:
        found = []
        for rel in dirs:
            top, _, sub = rel.partition("/")
            if top in self.pkgs:
                base = self.pkgs[top] / sub
                found += sorted(base.rglob("*.py")) if base.is_dir() else [base] * base.is_file()
        return found

    def _stamp(self) -> str:
        """funasr's version and the mtimes of every source a scan may read."""
        digest = hashlib.sha256(b"".join(p.read_bytes() for p in self._files("funasr/version.txt")))
        for path in self._files("funasr", "funasr_recipe", "torch/optim", "torch/version.py"):
            digest.update(f"{path}:{path.stat().st_mtime_ns}\n".encode())
        return digest.hexdigest()

    def save(self) -> None:
        """Write the cache if anything was scanned; a cache dir that cannot be written only costs time."""
        try:
            if not self.dirty:
                return
            self.cache_file.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.cache_file.with_name(f"{self.cache_file.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"stamp": self.stamp, "entries": self.entries}), encoding="utf-8")
            tmp.replace(self.cache_file)
        except OSError:
            pass

    def _cached(self, key: str, compute: Any) -> Any:
        if key not in self.entries:
            self.entries[key], self.dirty = compute(), True
        return self.entries[key]

    def tree(self, path: Path) -> ast.Module:
        return self.trees.get(path) or self.trees.setdefault(path, ast.parse(self.text(path)))

    def _module_file(self, module: str) -> Path | None:
        top, *rest = module.split(".")
        base = self.pkgs[top].joinpath(*rest) if top in self.pkgs else Path("/nonexistent")
        return next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()), None)

    def _package_of(self, file: Path) -> list[str]:
        name, base = next((n, b) for n, b in self.pkgs.items() if file.is_relative_to(b))
        return [name, *file.relative_to(base).parent.parts]

    def resolve(self, file: Path, name: str, depth: int = 0) -> tuple[Path, ast.ClassDef] | None:
        """The class ``name`` (``a.b.C`` too) means in ``file``: defined there or imported into it."""
        if "." in name:
            module, _, name = name.rpartition(".")
            if (found := self._module_file(module)) is None:
                return None
            file = found
        tree = self.tree(file)
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                return file, node
        for node in ast.walk(tree):
            for alias in node.names if isinstance(node, ast.ImportFrom) and depth < 6 else []:
                if (alias.asname or alias.name) != name:
                    continue
                package = self._package_of(file)  # where a relative import starts
                base = package[:len(package) - node.level + 1] if node.level else []
                found = self._module_file(".".join([*base, *(node.module or "").split(".")]).strip("."))
                if found is not None and (hit := self.resolve(found, alias.name, depth + 1)):
                    return hit
        return None

    def class_keys(self, file: Path, cls: ast.ClassDef, skip: int = 0, depth: int = 0,
                   follow: bool = True) -> Keys | None:
        """The keys ``cls(**conf)`` takes (``_fn_keys``); a class without __init__ takes its bases' (a base
        the scan cannot find, nn.Module, takes none)."""
        init = next((f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
        return self._bases(file, cls, skip, depth) if init is None else \
            self._fn_keys(file, init, cls, 1 + skip, depth, follow)

    def _fn_keys(self, file: Path, fn: ast.FunctionDef, cls: ast.ClassDef | None, first: int,
                 depth: int, follow: bool = True) -> Keys | None:
        """``fn``'s parameters (the first ``first`` positional ones left out: self, and what funasr passes
        itself), what it reads of its ``**kwargs``, and (``follow``) the keys of the class it passes them on
        to; ANY where they go somewhere the scan cannot follow."""
        args = fn.args
        positional = [*args.posonlyargs, *args.args]
        defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
        pairs = [*list(zip(positional, defaults, strict=True))[first:],
                 *zip(args.kwonlyargs, args.kw_defaults, strict=True)]
        keys: Keys = {a.arg: _typed(d, a.annotation) for a, d in pairs}
        if args.kwarg is None:
            return keys
        merge_keys(keys, _Scope(fn, ("@",)).reads.get(("@",), {}))
        if not follow:
            return keys
        for node in ast.walk(fn):
            passed = [k.value for k in getattr(node, "keywords", []) if k.arg is None]
            passed = [p.values[0] if isinstance(p, ast.BoolOp) else p for p in passed]
            if not any(isinstance(p, ast.Name) and p.id == args.kwarg.arg for p in passed):
                continue
            func = node.func  # type: ignore[attr-defined]
            if isinstance(func, ast.Attribute) and func.attr == "__init__" and cls is not None:
                more = self._bases(file, cls, first - 1, depth)
            else:  # passed on to something the scan cannot follow: it may read any key, so accept them all
                more = self._keys_of(file, [ast.unparse(func)], 0, depth, ANY)
            if more is ANY:
                return ANY
            merge_keys(keys, more)
        return keys

    def _bases(self, file: Path, cls: ast.ClassDef, skip: int, depth: int) -> Keys | None:
        return self._keys_of(file, [ast.unparse(b) for b in cls.bases], skip, depth, {})

    def _keys_of(self, file: Path, names: list[str], skip: int, depth: int,
                 missing: Keys | None) -> Keys | None:
        """The keys of the classes ``names`` (as ``file`` names them) together; ``missing`` for one the scan
        cannot find."""
        keys: Keys = {}
        for name in names:
            hit = self.resolve(file, name) if depth < 8 else None
            if (more := self.class_keys(*hit, skip=skip, depth=depth + 1) if hit else missing) is ANY:
                return ANY
            merge_keys(keys, more)
        return keys

    def _named(self, table: str, name: str) -> list[tuple[Path, ast.ClassDef]]:
        """The classes registered as ``name`` in funasr's ``table``, else those so named (funasr, recipe)."""
        mention = re.compile(rf"class\s+{re.escape(name)}\b|[\"']{re.escape(name)}[\"']\s*\)")
        hits = []
        for file in self._files("funasr", "funasr_recipe"):
            if name in self.text(file) and mention.search(self.text(file)):
                for node in _top(self.tree(file), ast.ClassDef):
                    marks = [(_const(d.args[0]), _const(d.args[1])) for d in node.decorator_list
                             if isinstance(d, ast.Call) and len(d.args) == 2]
                    if (table, name) in marks or node.name == name:
                        hits.append((0 if (table, name) in marks else 1, file, node))
        return [(f, n) for rank, f, n in hits if rank == min(h[0] for h in hits)]

    def named_class(self, table: str, name: str) -> Keys | None:
        """The keys of the class registered as ``name`` in funasr's ``table`` (or so named), in funasr or
        the recipe; ANY when there is none (the run fails on the name itself, not on its keys)."""
        def compute() -> Keys | None:
            keys: Keys = {}
            hits = self._named(table, name)
            for file, node in hits:  # two modules registering one name: either may win, take both
                if (more := self.class_keys(file, node)) is ANY:
                    return ANY
                merge_keys(keys, more)
            return keys if hits else ANY
        return self._cached(f"class:{table}:{name}", compute)

    def table_class(self, table_file: str, table: str, name: str) -> Keys | None:
        """The keys of ``table[name]``: funasr's ``table = dict(name=Class, ...)`` (optim_classes,
        scheduler_classes) or the recipe's ``table[NAME] = Class``, less the first positional parameter
        (params, optimizer: funasr passes it)."""
        def compute() -> Keys | None:
            for file in [f for f in self._files(table_file, "funasr_recipe") if table in self.text(f)]:
                consts = {t.id: _const(n.value) for n in self.tree(file).body if isinstance(n, ast.Assign)
                          for t in n.targets if isinstance(t, ast.Name)}
                for node in ast.walk(self.tree(file)):
                    target = node.targets[0] if isinstance(node, ast.Assign) else None
                    entries = [(k.arg, k.value) for k in getattr(node.value, "keywords", [])] \
                        if isinstance(target, ast.Name) and target.id == table else \
                        [(_const(target.slice) or consts.get(getattr(target.slice, "id", "")), node.value)] \
                        if isinstance(target, ast.Subscript) and ast.unparse(target.value) == table else []
                    for key, value in entries:
                        if key == name and (hit := self.resolve(file, ast.unparse(value))):
                            return self.class_keys(*hit, skip=1)
            return ANY
        return self._cached(f"table:{table}:{name}", compute)

    def fixed(self) -> dict[str, Keys]:
        """Keys read by the code every config goes through: "" (top level), train_conf, dataset_conf, and
        every ``section.key`` read in those files."""
        def compute() -> dict[str, Keys]:
            sections: dict[str, Keys] = {}

            def add(files: list[Path], root: tuple[str, ...]) -> None:
                for file in files:
                    for fn in _top(self.tree(file), ast.FunctionDef, methods=True):
                        if root == () and fn.name == "__init__" and file.parent.name == "train_utils":
                            continue  # Trainer.__init__: its kwargs are train_conf, below
                        for base, keys in _Scope(fn, root).reads.items():
                            merge_keys(sections.setdefault(".".join(base), {}), keys)
            top = ["funasr/bin/train_ds.py", "funasr/auto/auto_model.py", "funasr/download",
                   "funasr/utils/misc.py", "funasr/train_utils/trainer_ds.py",
                   "funasr/train_utils/trainer.py", "funasr/datasets/dataloader_entry.py",
                   "funasr_recipe/compat", "funasr_recipe/train", "funasr_recipe/model/config.py",
                   "funasr_recipe/model/trainer.py"]
            add(self._files(*top), ())
            data = self._files("funasr/datasets", "funasr_recipe/data")
            add([f for f in data if f.name != "dataloader_entry.py"], ("dataset_conf",))
            trainers = self._files("funasr/train_utils/trainer_ds.py", "funasr/train_utils/trainer.py")
            for file in data + trainers:
                section = "train_conf" if file in trainers else "dataset_conf"
                for cls in _top(self.tree(file), ast.ClassDef):
                    # Not followed: a dataset passes its kwargs on to the classes dataset_conf names
                    # (index_ds, batch_sampler), which are in this union.
                    if section == "dataset_conf" or cls.name == "Trainer":
                        merge_keys(sections.setdefault(section, {}), self.class_keys(file, cls, follow=False))
            return sections
        return self._cached("fixed", compute)

    def callee_keys(self, model: str, section: str) -> Keys | None:
        """The keys of the class ``model``'s __init__ builds with ``**<section>`` (``CTC(**ctc_conf)``)."""
        def compute() -> Keys | None:
            for file, cls in self._named("model_classes", model):
                for node in ast.walk(cls):
                    for kw in getattr(node, "keywords", []):
                        value = kw.value.values[0] if isinstance(kw.value, ast.BoolOp) else kw.value
                        if kw.arg is None and isinstance(value, ast.Name) and value.id == section and \
                                (hit := self.resolve(file, ast.unparse(node.func))):  # type: ignore[attr-defined]
                            return self.class_keys(*hit)
            return ANY  # built from a name the config does not give (normalize_class): cannot tell
        return self._cached(f"callee:{model}:{section}", compute)

    def function_keys(self, module: str, name: str, skip: int) -> Keys | None:
        """The parameters of function ``name`` of ``module`` but the first ``skip``."""
        file = self._module_file(module)
        fn = next(f for f in _top(self.tree(file), ast.FunctionDef) if f.name == name)  # type: ignore[arg-type]
        return self._fn_keys(file, fn, None, skip, 0)  # type: ignore[arg-type]
