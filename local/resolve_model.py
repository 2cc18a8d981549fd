"""Find the pretrained model a config fine-tunes: a local dir, the ModelScope cache, or a download.

Reads  the config's ``pretrained_model`` (hub name or directory) and ``--pretrained-dir``;
writes the resolved directory to stdout (nothing for a from-scratch config). Offline with a hub name
that is not cached, it fails at once with the command that downloads the model, instead of letting
funasr's trainer retry the hub on every rank.

  python -m local.resolve_model --config conf/sensevoice_small.yaml [--pretrained-dir DIR]
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
from pathlib import Path

from local.bad_input import split_overrides
from local.log_utils import setup_logging
from local.model_config import load_config, pretrained_model

log = logging.getLogger(__name__)
HUB_HOST = ("www.modelscope.cn", 443)
MODEL_FILES = ("configuration.json", "config.yaml")


class ModelNotFound(Exception):
    """The pretrained model is neither local nor downloadable; the message says what to run."""


def is_model_dir(path: Path) -> bool:
    return path.is_dir() and any((path / f).is_file() for f in MODEL_FILES) and (path / "model.pt").exists()


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


def main(argv: list[str] | None = None) -> int:
    own, overrides = split_overrides(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--pretrained-dir", type=Path, help="a local copy of the config's pretrained model")
    args = parser.parse_args(own)
    setup_logging()
    name = pretrained_model(load_config(args.config, overrides))
    if name is None:
        if args.pretrained_dir:
            log.warning("%s trains from scratch: --pretrained-dir %s is ignored", args.config,
                        args.pretrained_dir)
        return 0
    try:
        print(resolve(name, args.pretrained_dir))
    except ModelNotFound as e:
        log.error("%s", e)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
