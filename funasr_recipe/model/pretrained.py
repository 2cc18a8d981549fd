"""Find the pretrained model a config fine-tunes: a local dir, the ModelScope cache, or a download.

Reads  a hub name or directory (the config's ``pretrained_model``) and an optional local copy; returns
the local directory. Offline with a hub name that is not cached, it fails at once with the command that
downloads the model, instead of letting funasr's trainer retry the hub on every rank. ``check_fits``
refuses a model dir that the config cannot fine-tune (a from-scratch config, another model class).

  resolve("iic/SenseVoiceSmall", pretrained_dir=None)  # -> Path of the model dir
  check_fits(Path("conf/sensevoice_small.yaml"), "iic/SenseVoiceSmall", "SenseVoiceSmall", d, model_dir=d)
"""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path

from funasr_recipe.core.rejections import BadInputError
from funasr_recipe.model.model_dir import MODEL_FILES, is_model_dir

log = logging.getLogger(__name__)
HUB_HOST = ("www.modelscope.cn", 443)


class ModelNotFound(FileNotFoundError):
    """The pretrained model is neither local nor downloadable; the message says what to run."""


def cached(name: str) -> Path | None:
    """The model in ModelScope's cache (MODELSCOPE_CACHE or ~/.cache/modelscope/hub), if complete."""
    root = Path(os.environ.get("MODELSCOPE_CACHE", Path.home() / ".cache" / "modelscope" / "hub"))
    for path in (root / "models" / name, root / name):
        if is_model_dir(path):
            return path
    return None


def online(timeout: float = 5.0) -> bool:
    try:
        socket.create_connection(HUB_HOST, timeout=timeout).close()
        return True
    except OSError:
        return False


def resolve(name: str, pretrained_dir: Path | None = None) -> Path:
    """The local directory of ``name`` (a hub name or a path), downloading it when possible."""
    if pretrained_dir is not None:
        if not is_model_dir(pretrained_dir):
            raise ModelNotFound(f"--pretrained-dir {pretrained_dir} is not a model dir (needs model.pt and "
                                f"{' or '.join(MODEL_FILES)})")
        return pretrained_dir.resolve()
    if Path(name).is_dir():
        if not is_model_dir(Path(name)):
            raise ModelNotFound(f"pretrained_model {name} is a directory but not a model dir")
        return Path(name).resolve()
    if (path := cached(name)) is not None:
        log.info("%s: found in the ModelScope cache at %s", name, path)
        return path
    if not online():
        raise ModelNotFound(
            f"{name} is not in the ModelScope cache and {HUB_HOST[0]} cannot be reached. On a machine with "
            f"internet run:\n    modelscope download --model {name} --local_dir /path/to/{Path(name).name}\n"
            f"copy that folder here, then rerun with --pretrained-dir /path/to/{Path(name).name}")
    from modelscope import snapshot_download

    log.info("%s: downloading from ModelScope", name)
    return Path(snapshot_download(name))


def check_fits(config: Path, name: str | None, config_model: str | None, pretrained_dir: Path | None,
               model_dir: Path | None = None) -> None:
    """BadInputError when the model dir cannot be what ``config`` fine-tunes: a from-scratch config (no
    ``pretrained_model``, ``name`` None) reads no --pretrained-dir, and would train from scratch under a
    fine-tune's name; a model dir whose config.yaml names another class than the config's ``model:``
    (funasr merges the config over the model's own, so the config's class would be built with the other
    model's settings and fail far from the cause)."""
    if name is None:
        if pretrained_dir is not None:
            raise BadInputError(f"{config} trains from scratch (no pretrained_model), so nothing reads "
                                f"--pretrained-dir {pretrained_dir}: fine-tune it with a config that has "
                                "pretrained_model (conf/sensevoice_small.yaml, conf/paraformer.yaml)")
        return
    conf = None if model_dir is None else model_dir / "config.yaml"
    if config_model is None or conf is None or not conf.is_file():
        return
    from omegaconf import OmegaConf

    theirs = OmegaConf.load(conf).get("model")
    if theirs is not None and str(theirs) != str(config_model):
        fitting = sorted(p.name for p in config.parent.glob("*.yaml")
                         if "pretrained_model:" in (text := p.read_text(encoding="utf-8"))
                         and f"\nmodel: {theirs}\n" in text)
        hint = f": use {' or '.join(fitting)}" if fitting else ""
        raise BadInputError(f"{model_dir} holds a {theirs} model and {config} fine-tunes {config_model}"
                            f"{hint} (the config picks the training settings, the model dir the model)")
