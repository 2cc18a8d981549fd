"""Stage-independent check of a run's command line, in run.sh's first seconds (before any stage): the
trainer overrides after ``--``, the DeepSpeed config and the CMVN files. Exits 2 listing every problem, one
line each, and 0 silently when there is none; imports neither torch nor funasr (about 0.5 s).

Reads  the model config (and, for a fine-tune, the pretrained model's config.yaml, which funasr merges
       under it: from --pretrained-dir, the config's pretrained_model dir, the ModelScope cache, or else
       the released architecture of model/released_configs/), the --ds-config JSON, each --cmvn am.mvn,
       funasr's sources (funasr_recipe/model/overrides.py: which keys funasr reads) and that scan's cache;
writes the scan's cache (~/.cache/funasr_recipe/config_keys.json).

  .venv/bin/python -m local.check_config --config conf/tiny_sensevoice.yaml [--pretrained-dir D] \
      [--ds-config ds_configs/ds_stage1_bf16.json] [--cmvn dump/train/am.lfr7x6.mvn ...] -- <overrides>

The overrides: a run.sh option written after ``--``, a Hydra syntax error, what Hydra itself refuses (``+``
on a key the config has, ``key=``/``~key`` on one it lacks), a key funasr does not read
(``unknown key dataset_conf.batchsize (did you mean dataset_conf.batch_size?)``), a value of another
type than the config's or the reading code's default (``optim_conf.lr=abc: expected a number (the config
has 0.002)``; an integer for a number is fine), and a value of a recipe key that its reader refuses
(``feats_storage``: float32 or uint16; ``feats_augment``: features/augment.py's keys and ranges).
"""

from __future__ import annotations

import argparse
import copy
import difflib
import json
import logging
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from funasr_recipe.core.cli import EXIT_BAD_INPUT, program_parser, run_main, split_overrides
from funasr_recipe.core.log import setup_logging
from funasr_recipe.core.rejections import BadInputError
from funasr_recipe.model.config import feats_augment, feats_storage, pretrained_model
from funasr_recipe.model.overrides import ANY, Keys, Scan, merge_keys, type_tag
from funasr_recipe.train.zero import read_ds_config

log = logging.getLogger(__name__)
OPTIONS_AFTER = "comes after --: run.sh options go before --, trainer overrides after"
WORDS = {"bool": "true or false", "int": "an integer", "float": "a number", "list": "a list",
         "dict": "a mapping"}
ZERO_STAGES = range(4)  # DeepSpeed's ZeRO: 0 (off), 1 optimizer states, 2 + gradients, 3 + parameters


def section_keys(scan: Scan, cfg: dict, section: str) -> Keys | None:
    """The keys of ``section`` funasr reads for config ``cfg`` (the top level for ""; model/overrides.py
    says from where); ANY where the scan cannot tell."""
    model = scan.named_class("model_classes", cfg["model"]) if isinstance(cfg.get("model"), str) else ANY
    name = section.removesuffix("_conf")
    if section in ("", "train_conf", "dataset_conf"):
        keys = {} if section or model is ANY else model  # the model gets every top-level key
    elif section == "build_tokenizer":  # stage 1 calls build_tokenizer(jsonl, out_dir, **section)
        keys = scan.function_keys("funasr_recipe.model.tokenizer", section, 2)
    elif section in ("optim_conf", "scheduler_conf"):
        # funasr's own choice when the config names none (warp_optim_scheduler): adam, warmuplr
        default, table = {"optim": ("adam", "optimizers"), "scheduler": ("warmuplr", "schedulers")}[name]
        keys = scan.table_class(f"funasr/{table}/__init__.py", f"{name}_classes", str(cfg.get(name, default)))
    elif section == "model_conf":
        keys = model
    elif not section.endswith("_conf"):
        return ANY  # a mapping of its own (hydra.*, a class's nested options): not checked
    elif isinstance(cfg.get(name), str):
        keys = scan.named_class(f"{name}_classes", cfg[name])
    else:
        keys = scan.callee_keys(str(cfg.get("model")), section)
    if keys is ANY:
        return ANY
    union: Keys = copy.deepcopy(keys)
    merge_keys(union, scan.fixed().get(section))
    return union


def _lookup(cfg: Any, path: list[str]) -> tuple[bool, Any]:
    for part in path:
        if not isinstance(cfg, dict) or part not in cfg:
            return False, None
        cfg = cfg[part]
    return True, cfg


def _leaves(path: list[str], value: Any) -> Iterator[tuple[list[str], Any]]:
    """``path`` and, for a mapping given whole (``++dataset_conf={batch_size: 1}``), each key inside it."""
    yield path, value
    for key, inner in value.items() if isinstance(value, dict) and len(path) < 2 else ():
        yield from _leaves([*path, str(key)], inner)


def _unknown(path: list[str], merged: dict, keys: Any) -> str | None:
    """The unknown-key problem of ``path``, or None; ``keys(section)`` gives a section's known keys."""
    if path[0] == "hydra" or _lookup(merged, path)[0]:
        return None
    level = 0 if path[0] not in (top := keys("")) and path[0] not in merged else 1
    known = top if level == 0 else keys(path[0]) if len(path) > 1 else ANY
    if known is ANY or level == 1 and (path[1] in known or _lookup(merged, path[:2])[0]):
        return None
    have = _lookup(merged, path[:level])[1]
    candidates = sorted({*known, *(have if isinstance(have, dict) else ())})
    close = difflib.get_close_matches(path[level], candidates, 1)
    hint = f" (did you mean {'.'.join([*path[:level], close[0], *path[level + 1:]])}?)" if close else ""
    return f"unknown key {'.'.join(path)}{hint}"


def _wrong_type(path: list[str], value: Any, shown: str, merged: dict, keys: Any) -> str | None:
    """The type problem of ``path=value`` against the config's value and the reading code's default."""
    if value is None or isinstance(value, str) and "${" in value:
        return None  # null, or an interpolation Hydra resolves later
    present, have = _lookup(merged, path)
    present = present and have is not None
    section = keys("") if len(path) == 1 else keys(path[0]) if len(path) == 2 else ANY
    code, default = (section or {}).get(path[-1], [None, None])
    tags = {t for t in (type_tag(have) if present else None, code) if t}
    # A float in the code and an int in the config (0) is a number; other disagreements, and a parameter
    # the code declares with several types ("*"), are not checked.
    tag = "float" if tags == {"int", "float"} else tags.pop() if len(tags) == 1 and code != "*" else None
    number = isinstance(value, int | float) and not isinstance(value, bool)
    ok = {"bool": isinstance(value, bool), "int": number and isinstance(value, int), "float": number,
          "list": isinstance(value, list), "dict": isinstance(value, dict)}.get(tag or "", True)
    if ok:
        return None
    origin = f" (the config has {json.dumps(have)})" if present and tag != "dict" else \
        f" (the default is {default})" if default is not None and tag != "dict" else ""
    return f"{'.'.join(path)}={shown}: expected {WORDS[tag]}{origin}"  # type: ignore[index]


def _parse(overrides: list[str]) -> tuple[list[tuple[int, str]], list[tuple[int, str, Any]]]:
    """(problems, parsed overrides), each with its argument's position: a run.sh option (with its value)
    after ``--``, an override Hydra's grammar refuses (parsed one by one, so that the error names it)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser, problems, parsed, i = OverridesParser.create(), [], [], 0
    while i < len(overrides):
        arg, at = overrides[i], i
        if arg.startswith("--"):
            following = overrides[i + 1] if i + 1 < len(overrides) else "="
            if "=" not in arg and "=" not in following and not following.startswith(("-", "+", "~")):
                arg, i = f"{arg} {following}", i + 1
            problems.append((at, f"{arg} {OPTIONS_AFTER}"))
        else:
            try:
                parsed.append((at, arg, parser.parse_overrides([arg])[0]))
            except HydraException as e:
                lines = [ln for ln in str(e).splitlines() if ln.strip() not in ("", "^")
                         and not ln.startswith(("See https", "Error parsing override"))]
                problems.append((at, f"{arg}: {'; '.join(lines)} (Hydra's override grammar)"))
        i += 1
    return problems, parsed


def check_overrides(overrides: list[str], ours: dict, merged: dict, where: str,
                    scan: Scan | None = None) -> list[str]:
    """Every problem of the trainer overrides ``overrides`` (what run.sh passes after ``--``), one line
    each, in their order: ``_parse``'s, what Hydra itself refuses (``+`` on a key the config ``where``
    (``ours``) has, ``key=`` or ``~key`` on one it lacks), an unknown key (with the closest known one), a
    value of the wrong type. ``merged``: the config funasr runs with (a fine-tune's model config under
    ours), before the overrides."""
    problems, parsed = _parse(overrides)
    final, ours = with_overrides(merged, overrides), copy.deepcopy(ours)  # the classes the overrides choose
    scan = scan or Scan()
    sections: dict[str, Any] = {}

    def keys(section: str) -> Keys | None:
        if section not in sections:
            sections[section] = section_keys(scan, final, section)  # type: ignore[arg-type]
        return sections[section]

    for at, arg, o in parsed:
        key, path, kind = o.key_or_group, o.key_or_group.split("."), o.type.name
        has = _lookup(ours, path)[0]
        problem = next(filter(None, (_unknown(p, merged, keys) for p, _ in _leaves(path, o.value()))), None)
        if problem is None and path[0] != "hydra":
            problem = f"{arg}: {where} has no {key}: write ++{arg} to add it" if kind == "CHANGE" and not has\
                else f"{arg}: {where} already has {key}: write +{arg} to change it" if kind == "ADD" and has \
                else f"{arg}: {where} has no {key} to delete" if kind == "DEL" and not has \
                else f"{arg}: several values need Hydra's --multirun, which stage 2 does not use (a list: " \
                     "[a,b])" if o.is_sweep_override() else None
        if problem is None and not o.is_delete():
            shown = arg.split("=", 1)[1]
            problem = next(filter(None, (_wrong_type(p, v, shown if p == path else json.dumps(v), merged,
                                                     keys) for p, v in _leaves(path, o.value()))), None)
        problems += [(at, problem)] if problem else []
        _apply(ours, path, o)
    scan.save()
    return [problem for _, problem in sorted(problems)]


def _apply(cfg: dict, path: list[str], override: Any) -> None:
    """``override`` done on the plain dict ``cfg``, as Hydra does it on the config."""
    *parents, last = path
    for part in parents:
        if not isinstance(cfg.get(part), dict):
            if override.is_delete():
                return
            cfg[part] = {}
        cfg = cfg[part]
    if override.is_delete():
        cfg.pop(last, None)
    else:
        cfg[last] = override.value()


def _load(path: Path) -> dict:
    try:
        cfg = OmegaConf.load(path)
    except Exception as e:  # noqa: BLE001  (yaml's and OmegaConf's errors share no base class)
        raise BadInputError(f"{path}: not a readable YAML config: {e}") from e
    try:
        return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
    except Exception:  # noqa: BLE001  (an interpolation of a key the overrides add: kept unresolved)
        return OmegaConf.to_container(cfg, resolve=False)  # type: ignore[return-value]


def configs(config: Path, pretrained_dir: Path | None) -> tuple[dict, dict]:
    """(our config, the config funasr trains with before the overrides): for a fine-tune (pretrained_model,
    no model_conf: train_ds.main_hydra reads the model dir) the model's config.yaml with ours merged over
    it, as download_model does."""
    if not config.is_file():
        raise FileNotFoundError(f"model config not found: {config}")
    ours = _load(config)
    name = pretrained_model(OmegaConf.create(ours))
    from funasr_recipe.model.pretrained import cached, check_fits

    check_fits(config, name, ours.get("model"), pretrained_dir)
    if name is None or "model_conf" in ours:
        return ours, ours

    if pretrained_dir is not None and not pretrained_dir.is_dir():
        raise BadInputError(f"--pretrained-dir {pretrained_dir}: no such directory")
    model_dir = pretrained_dir or (Path(name) if Path(name).is_dir() else cached(name))
    check_fits(config, name, ours.get("model"), pretrained_dir, model_dir)
    if model_dir is not None and (model_dir / "config.yaml").is_file():
        base = _load(model_dir / "config.yaml")
    else:  # not downloaded yet (stage 2 does it): the architecture the recipe records for the family
        from funasr_recipe.families.registry import FAMILIES
        from funasr_recipe.model.released import released_path

        spec = FAMILIES.get(str(ours.get("model")))
        base = _load(released_path(spec.released)) if spec and spec.released else {}
    return ours, OmegaConf.to_container(OmegaConf.merge(base, ours))  # type: ignore[return-value]


def check_ds_config(path: Path) -> None:
    """BadInputError for a DeepSpeed JSON that DeepSpeed would refuse only once every rank has started."""
    try:
        conf = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise BadInputError(f"--ds-config {path}: {e.strerror}") from e
    except json.JSONDecodeError as e:
        raise BadInputError(f"{path}:{e.lineno}:{e.colno}: not valid JSON: {e.msg}") from e
    if not isinstance(conf, dict):
        raise BadInputError(f"{path}: a DeepSpeed config is a JSON object, not {type(conf).__name__}")
    zero = conf.get("zero_optimization")
    stage = zero.get("stage", 0) if isinstance(zero, dict) else 0
    if isinstance(stage, bool) or stage not in ZERO_STAGES:
        raise BadInputError(f"{path}: zero_optimization.stage is {json.dumps(stage)}: DeepSpeed's ZeRO "
                            f"stages are {', '.join(map(str, ZERO_STAGES))}")


# funasr's trainer reads these train_conf keys on its DDP path only; under DeepSpeed the engine takes them
# from its JSON (key, DeepSpeed's default), so a train_conf value that differs would be read by nobody.
DEEPSPEED_OWNED = {"accum_grad": ("gradient_accumulation_steps", 1), "grad_clip": ("gradient_clipping", 0.0)}


def check_engine_keys(path: Path, cfg: dict) -> None:
    """BadInputError for a train_conf setting that DeepSpeed would silently not apply: one whose value is
    not the --ds-config JSON's."""
    try:
        conf = read_ds_config(path)
    except (OSError, BadInputError):
        return  # check_ds_config names what is wrong with the file
    train = cfg.get("train_conf") or {}
    if not isinstance(train, dict):
        return
    for key, (ds_key, default) in DEEPSPEED_OWNED.items():
        ours, theirs = train.get(key), conf.get(ds_key, default)
        if isinstance(ours, int | float) and float(ours) != float(theirs):
            raise BadInputError(f"train_conf.{key}={ours}: under DeepSpeed funasr's trainer does not read "
                                f"it, {path}'s {ds_key} ({theirs}) decides: set it there, or train with "
                                "--train-engine ddp")


def check_cmvn(path: Path, cfg: dict, scan: Scan) -> None:
    """BadInputError for an am.mvn that is malformed (features/cmvn.read_am_mvn) or whose dimension is not
    config ``cfg``'s frontend's n_mels x lfr_m (stage 1's am.lfr<m>x<n>.mvn of another LFR setting, which
    this config does not read, only for the first)."""
    from funasr_recipe.features.cmvn import read_am_mvn

    if not path.is_file():
        raise BadInputError(f"--cmvn {path}: no such file")
    shift, _ = read_am_mvn(path)
    front, defaults = cfg.get("frontend_conf") or {}, section_keys(scan, cfg, "frontend_conf") or {}

    def value(key: str) -> Any:  # the config's, else the frontend class's default
        default = (defaults.get(key) or [None, None])[1]
        return front.get(key, json.loads(default) if default else None)

    n_mels, lfr_m, lfr_n = (value(k) for k in ("n_mels", "lfr_m", "lfr_n"))
    setting = re.fullmatch(r"am\.lfr(\d+)x(\d+)\.mvn", path.name)
    if setting and (int(setting[1]), int(setting[2])) != (lfr_m, lfr_n):
        return
    if isinstance(n_mels, int) and isinstance(lfr_m, int) and shift.shape[0] != n_mels * lfr_m:
        raise BadInputError(f"{path}: {shift.shape[0]} dimensions, but the config's frontend gives "
                            f"n_mels {n_mels} x lfr_m {lfr_m} = {n_mels * lfr_m}")


def with_overrides(cfg: dict, overrides: list[str]) -> dict:
    """``cfg`` with the overrides Hydra can parse done on it (a sweep's, ++model=<dir>'s left out)."""
    cfg = copy.deepcopy(cfg)
    for _, _, o in _parse(overrides)[1]:
        # ++model=<dir> (how stage 2 passes a fine-tune's model dir) names no class.
        if not o.is_sweep_override() and not (o.key_or_group == "model" and "/" in str(o.value())):
            _apply(cfg, o.key_or_group.split("."), o)
    return cfg


def problems_of(args: argparse.Namespace, overrides: list[str]) -> list[str]:
    """Every problem of the command line, one line each (empty: all good)."""
    scan = Scan()
    ours, merged = configs(args.config, args.pretrained_dir)
    problems = check_overrides(overrides, ours, merged, str(args.config), scan)
    # The recipe's own keys, whose values stage 1 would refuse only once it starts.
    recipe_cfg = OmegaConf.create(with_overrides(ours, overrides))
    checks = [(feats_storage, (recipe_cfg,)), (feats_augment, (recipe_cfg,))]
    if args.ds_config:
        checks += [(check_ds_config, (args.ds_config,)),
                   (check_engine_keys, (args.ds_config, with_overrides(merged, overrides)))]
    checks += [(check_cmvn, (path, with_overrides(merged, overrides), scan)) for path in args.cmvn]
    for check, check_args in checks:
        try:
            check(*check_args)  # type: ignore[operator]
        except BadInputError as e:
            problems.append(str(e))
    return problems


def build_parser() -> argparse.ArgumentParser:
    """This program's options (its --help; the docs' reference is made from it)."""
    parser = program_parser(__doc__)
    parser.add_argument("--config", type=Path, required=True, help="the model config (conf/*.yaml)")
    parser.add_argument("--pretrained-dir", type=Path, help="the local copy of the config's pretrained model")
    parser.add_argument("--ds-config", type=Path, help="the DeepSpeed JSON stage 2 trains with")
    parser.add_argument("--cmvn", type=Path, action="append", default=[],
                        help="an am.mvn training reads (repeatable)")
    return parser


def main(argv: list[str] | None = None) -> int:
    own, overrides = split_overrides(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(own)
    setup_logging()

    def work() -> int:
        problems = problems_of(args, overrides)
        for problem in problems:
            log.error("%s", problem)
        return EXIT_BAD_INPUT if problems else 0

    return run_main(work, log)


if __name__ == "__main__":
    sys.exit(main())
