"""Write a trained model as a model dir in the hub's format, loadable wherever a hub name is.

Reads  <exp-dir>/config.yaml (funasr's resolved config) and a checkpoint of <exp-dir>: a DeepSpeed
       checkpoint dir (its fp32 master weights, through DeepSpeed's zero_to_fp32) or a state-dict file;
       the am.mvn and tokenizer files the config points at;
writes <out>/{model.pt (fp32 state dict), config.yaml (file names relative to <out>), am.mvn,
       the tokenizer model, tokens.json, configuration.json}: the layout of ModelScope's
       iic/SenseVoiceSmall, so that funasr's AutoModel, funasr's trainer (fine-tuning with
       ``--pretrained-dir <out>``) and the next stages take it like a downloaded model.

  python -m local.make_model_dir --exp-dir exp/tiny_sensevoice --checkpoint model.pt.best
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
from pathlib import Path

import torch
from omegaconf import OmegaConf

from local.log_utils import setup_logging

log = logging.getLogger(__name__)


def fp32_state_dict(exp_dir: Path, checkpoint: str) -> dict[str, torch.Tensor]:
    """fp32 weights of a checkpoint: a DeepSpeed tag dir's master weights, or a state-dict file's."""
    path = exp_dir / checkpoint
    if path.is_dir():
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        # The fp32 master copy lives in the ZeRO optimizer shards; the module copy is bf16.
        state = get_fp32_state_dict_from_zero_checkpoint(str(exp_dir), tag=checkpoint)
    elif path.is_file():
        state = torch.load(path, map_location="cpu", weights_only=False)
        state = state.get("state_dict", state)
    else:
        raise FileNotFoundError(f"no checkpoint {path}")
    return {k: v.float() if v.is_floating_point() else v for k, v in state.items()}


def make_model_dir(exp_dir: Path, checkpoint: str, out: Path, info: dict | None = None) -> Path:
    """Write ``out`` from ``exp_dir``; returns it. ``info`` goes into configuration.json's "recipe"."""
    cfg = OmegaConf.load(exp_dir / "config.yaml")
    out.mkdir(parents=True, exist_ok=True)
    torch.save(fp32_state_dict(exp_dir, checkpoint), out / "model.pt")
    metas: dict = {"init_param": "model.pt", "config": "config.yaml"}
    cmvn = OmegaConf.select(cfg, "frontend_conf.cmvn_file")
    if cmvn:
        shutil.copyfile(cmvn, out / "am.mvn")
        cfg.frontend_conf.cmvn_file = "am.mvn"
        metas["frontend_conf"] = {"cmvn_file": "am.mvn"}
    bpe = OmegaConf.select(cfg, "tokenizer_conf.bpemodel")
    if bpe:
        shutil.copyfile(bpe, out / Path(bpe).name)
        tokens = Path(bpe).with_name("tokens.json")
        if tokens.is_file():
            shutil.copyfile(tokens, out / "tokens.json")
        cfg.tokenizer_conf.bpemodel = Path(bpe).name
        metas["tokenizer_conf"] = {"bpemodel": Path(bpe).name}
    for key in ("train_data_set_list", "valid_data_set_list", "output_dir", "init_param"):
        cfg.pop(key, None)  # paths of this run, meaningless elsewhere
    OmegaConf.save(cfg, out / "config.yaml")
    configuration = {"framework": "pytorch", "task": "auto-speech-recognition",
                     "model": {"type": "funasr"}, "pipeline": {"type": "funasr-pipeline"},
                     "model_name_in_hub": {"ms": "", "hf": ""}, "file_path_metas": metas,
                     "recipe": {"exp_dir": str(exp_dir.resolve()), "checkpoint": checkpoint, **(info or {})}}
    (out / "configuration.json").write_text(json.dumps(configuration, indent=2) + "\n", encoding="utf-8")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--exp-dir", type=Path, required=True)
    parser.add_argument("--checkpoint", default="model.pt.best",
                        help="checkpoint under --exp-dir: a DeepSpeed tag dir or a state-dict file")
    parser.add_argument("--out", type=Path, help="default: <exp-dir>/model_dir")
    args = parser.parse_args(argv)
    setup_logging()
    try:
        out = make_model_dir(args.exp_dir, args.checkpoint, args.out or args.exp_dir / "model_dir")
    except (FileNotFoundError, KeyError) as e:
        log.error("%s", e)
        return 1
    log.info("%s: model dir in the hub's format from %s", out, args.exp_dir / args.checkpoint)
    return 0


if __name__ == "__main__":
    sys.exit(main())
