"""Stage 2's guard against continuing a run under other settings.

funasr's trainer resumes whatever ``<exp-dir>/model.pt`` holds: rerun with another batch size, learning
rate or data and it continues (or, past max_epoch, merely relabels) the old weights, and writes the new
config beside them. So before torchrun starts, the settings that shape the model are compared with the
ones the checkpoints were trained with; any difference stops the run (exit 2) and names each key, old ->
new, unless the user asked to start over (``--restart true``), which moves the old run aside, never
deleting it.

Reads  <exp-dir>/train_identity.json (the settings the checkpoints there came from), the model config with
       the overrides applied, the DeepSpeed config, the training options, the dump's ``.done`` marker (data,
       features and tokenizer: stage 1's fingerprint covers them) and the pretrained model dir's file list;
writes <exp-dir>/train_identity.json (``record``; beside the settings, the config, pretrained dir and exp
       dir by the names the run was given them, ``given.*``: compared never, read by
       model/provenance.py to name what was used) and, on restart, moves the old run's files into
       <exp-dir>/superseded/<UTC time>/.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterable
from pathlib import Path

from funasr_recipe.core.rejections import BadInputError
from funasr_recipe.dist.markers import read_fingerprint
from funasr_recipe.model.config import load_config
from funasr_recipe.model.provenance import TRAIN_IDENTITY

log = logging.getLogger(__name__)

IDENTITY = TRAIN_IDENTITY
SUPERSEDED = "superseded"
# Keys that may change between a run and its resumption: they change how training is logged, checked or
# kept, or let it go on for longer, not what the weights so far were trained on. max_epoch may only grow:
# lowered below the epochs already trained, the config would claim fewer than the weights had.
RESUMABLE = frozenset({
    "config.train_conf.log_interval", "config.train_conf.validate_interval",
    "config.train_conf.save_checkpoint_interval", "config.train_conf.keep_nbest_models",
    "config.train_conf.avg_nbest_model", "config.train_conf.use_wandb", "config.train_conf.wandb_project",
    "config.train_conf.checkpoint_minutes", "config.dataset_conf.num_workers",
    "config.dataset_conf.prefetch_factor",
})
GROWS = frozenset({"config.train_conf.max_epoch"})
# Paths as the run was given them (its config, pretrained dir, exp dir): recorded to name what was used
# (model/provenance.py), never compared: their contents are (config.*, pretrained.*), so the same config
# under another name, or a moved exp dir, resumes.
GIVEN = "given."
# What stays in <exp-dir> on restart: the logs of this very invocation and the earlier runs set aside.
KEPT_ON_RESTART = frozenset({"log", SUPERSEDED})


def _flatten(prefix: str, value: object, out: dict[str, str]) -> None:
    if isinstance(value, dict) and value:
        for k, v in value.items():
            _flatten(f"{prefix}.{k}", v, out)
    else:
        out[prefix] = json.dumps(value, sort_keys=True)


def _dir_listing(root: Path) -> dict[str, str]:
    """Size and mtime of every file under ``root``: a swapped or re-downloaded pretrained model shows."""
    out = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        st = path.stat()
        out[f"pretrained.{path.relative_to(root)}"] = f"{st.st_size} bytes, mtime {int(st.st_mtime)}"
    return out


def identity(config: Path, overrides: list[str], ds_config: Path | None, options: dict[str, str],
             dump_marker: Path, pretrained_dir: Path | None, given: dict[str, str] | None = None
             ) -> dict[str, str]:
    """The run's settings that shape the model, flattened to ``area.key -> JSON value``, and ``given``:
    the paths by the names the run got them (``given.config``, ...; never compared)."""
    out = {f"{GIVEN}{name}": json.dumps(value) for name, value in sorted((given or {}).items())}
    _flatten("config", _container(load_config(config, overrides)), out)
    if ds_config is not None:
        try:
            ds = json.loads(ds_config.read_text())
        except json.JSONDecodeError as e:
            raise BadInputError(f"{ds_config}:{e.lineno}:{e.colno}: not valid JSON ({e.msg})") from None
        _flatten("ds_config", ds, out)
    for name, value in sorted(options.items()):
        out[f"option.{name}"] = json.dumps(value)
    fp = read_fingerprint(dump_marker)
    out["data"] = json.dumps(f"{dump_marker} fingerprint {fp}" if fp else f"{dump_marker} missing")
    if pretrained_dir is not None:
        out.update(_dir_listing(pretrained_dir))
    return out


def _container(cfg: object) -> dict:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]


def differences(old: dict[str, str], new: dict[str, str]) -> list[str]:
    """Each difference that forbids resuming, as ``key: old -> new`` (``(unset)`` for a missing side)."""
    lines = []
    for key in sorted(set(old) | set(new)):
        before, after = old.get(key), new.get(key)
        if before == after or key in RESUMABLE or key.startswith(GIVEN):
            continue
        if key in GROWS and None not in (before, after) and json.loads(after) >= json.loads(before):
            continue
        lines.append(f"{key}: {before if before is not None else '(unset)'} -> "
                     f"{after if after is not None else '(unset)'}")
    return lines


def checkpoints(exp_dir: Path) -> list[Path]:
    """What funasr would resume from or average: model.pt and its per-epoch/step siblings."""
    return sorted(p for p in exp_dir.glob("model.pt*")
                  if p.name == "model.pt" or p.name.startswith("model.pt."))


def set_aside(exp_dir: Path, keep: Iterable[str] = KEPT_ON_RESTART) -> Path | None:
    """Move everything of the old run in ``exp_dir`` (but ``keep``) into superseded/<UTC time>/."""
    entries = [p for p in exp_dir.iterdir() if p.name not in set(keep)]
    if not entries:
        return None
    dest = exp_dir / SUPERSEDED / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    dest.mkdir(parents=True, exist_ok=False)
    for p in entries:
        os.replace(p, dest / p.name)  # same file system: a rename each, nothing copied or lost
    return dest


def check(exp_dir: Path, new: dict[str, str], restart: bool) -> str:
    """Decide whether stage 2 may train in ``exp_dir``; returns what happened (fresh, resume, restart).
    Raises BadInputError naming every difference when the checkpoints there came from other settings."""
    record = exp_dir / IDENTITY
    old_ckpts = checkpoints(exp_dir)
    if restart:
        moved = set_aside(exp_dir)
        if moved:
            log.info("--restart true: the previous run's files are in %s", moved)
        return "restart"
    if not old_ckpts:
        return "fresh"
    if not record.is_file():
        raise BadInputError(
            f"{exp_dir} holds checkpoints ({old_ckpts[0].name}, ...) but no {IDENTITY}: what they were "
            "trained with is unknown, so they are not resumed. --restart true starts over (the old run is "
            f"moved to {exp_dir / SUPERSEDED}/), or use another --exp-dir")
    old = json.loads(record.read_text())
    if diffs := differences(old, new):
        raise BadInputError(
            f"{exp_dir} holds checkpoints trained with other settings; resuming would continue them under "
            f"the new ones. {len(diffs)} difference(s), old -> new:\n  " + "\n  ".join(diffs)
            + f"\nRerun with the old settings to resume, --restart true to start over (the old run is moved "
              f"to {exp_dir / SUPERSEDED}/, nothing is deleted), or use another --exp-dir. Keys that may "
              f"differ on resume: {', '.join(sorted(k.split('.', 1)[1] for k in RESUMABLE | GROWS))} "
              "(max_epoch only upwards).")
    return "resume"


def record(exp_dir: Path, new: dict[str, str]) -> None:
    """Write the identity the checkpoints about to be trained will carry (atomically)."""
    exp_dir.mkdir(parents=True, exist_ok=True)
    tmp = exp_dir / f".{IDENTITY}.tmp"
    tmp.write_text(json.dumps(new, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, exp_dir / IDENTITY)
