"""ONNX export (fp32 and int8) through funasr's own export, into a dir that funasr-onnx and the recipe's
runtime (runtime/onnx_asr.py) load.

Reads  a model dir in the hub's layout (config.yaml, model.pt, am.mvn, tokenizer) opened by AutoModel;
writes <out>/model.onnx          fp32, batch and time axes dynamic
       <out>/model_quant.onnx    int8: dynamic quantisation of the MatMul weights, funasr's settings
       <out>/config.yaml, am.mvn, tokens.json and the tokenizer (chn_jpn_yue_eng_ko_spectok.bpe.model
                                 for SenseVoiceSmall, else the model's own)
       <out>/export.json         what was exported, with which versions

SenseVoiceSmall and Paraformer go through funasr's own export (AutoModel.export: the model's export()
and funasr.utils.export_utils, which also quantises); ConformerCTC through the same path, which calls
its export() in model/conformer_ctc.py. funasr's export writes the two .onnx files only. funasr-onnx
reads the rest from the same dir and needs it in its own form, unlike a model dir's:
  - Paraformer: config.yaml's frontend_conf must not hold cmvn_file (funasr-onnx passes am.mvn itself:
    TypeError "multiple values for keyword argument 'cmvn_file'"); the hub's configs have none, ours do;
  - Paraformer with a sentencepiece tokenizer: ``lang: en-bpe``, or its post-processing raises
    "invalid character" on the pieces' "▁" and never returns a transcript;
  - SenseVoiceSmall: the sentencepiece model under the released name, whatever the model dir calls it;
  - both: an am.mvn, even for a model without global CMVN (an identity one is written then), and
    frontend_conf.dither: 0.0, as funasr-onnx's frontend otherwise adds random noise to every input.

  files = export_onnx(automodel, out) + write_runtime_files(model_dir, automodel, out)
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf

from funasr_recipe.core.env import versions
from funasr_recipe.families.registry import PARAFORMER, family_spec
from funasr_recipe.features.cmvn import write_am_mvn
from funasr_recipe.model.tokenizer import model_file_name
from funasr_recipe.runtime.onnx_asr import served_name

log = logging.getLogger(__name__)
OPSET = 14  # funasr's default


def family_of(model: torch.nn.Module) -> str:
    """The export family of a built model; subclasses (BiCifParaformer, ...) export other graphs."""
    return family_spec(type(model).__name__, "no ONNX export").name


@contextlib.contextmanager
def legacy_onnx_exporter() -> Iterator[None]:
    """``torch.onnx.export`` with ``dynamo=False`` for the duration of the block.

    torch 2.9 made the dynamo exporter the default; it needs onnxscript and fails on Paraformer.
    funasr's export_utils calls ``torch.onnx.export`` without the argument, so the default is changed
    here, and only while exporting, rather than patching funasr.
    """
    original = torch.onnx.export
    torch.onnx.export = functools.partial(original, dynamo=False)
    try:
        yield
    finally:
        torch.onnx.export = original


def export_onnx(automodel: Any, out: Path) -> list[Path]:
    """model.onnx and model_quant.onnx through funasr's export (the model's export() + export_utils)."""
    family_of(automodel.model)  # fail before exporting a class the runtime could not run
    out.mkdir(parents=True, exist_ok=True)
    # The quantiser logs one INFO line per tensor (thousands for SenseVoiceSmall).
    logging.disable(logging.INFO)
    try:
        with legacy_onnx_exporter():
            automodel.export(type="onnx", quantize=True, output_dir=str(out), device="cpu",
                             opset_version=OPSET)
    finally:
        logging.disable(logging.NOTSET)
    files = [out / "model.onnx", out / "model_quant.onnx"]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise RuntimeError(f"funasr's export wrote no {', '.join(missing)} in {out}")
    return files


def _vocabulary(tokenizer: Any) -> list[str]:
    if hasattr(tokenizer, "sp"):  # funasr's SentencepiecesTokenizer
        return [tokenizer.sp.IdToPiece(i) for i in range(tokenizer.sp.GetPieceSize())]
    return list(tokenizer.token_list)


def write_runtime_files(model_dir: Path, automodel: Any, out: Path) -> list[Path]:
    """config.yaml, am.mvn, tokens.json and the tokenizer in the form funasr-onnx reads (module docstring)."""
    spec = family_spec(family_of(automodel.model))
    cfg = OmegaConf.load(model_dir / "config.yaml")
    frontend, tokenizer = automodel.kwargs["frontend"], automodel.kwargs["tokenizer"]
    cfg.frontend_conf.pop("cmvn_file", None)
    cfg.frontend_conf.dither = 0.0
    if getattr(frontend, "cmvn_file", None):
        shutil.copyfile(frontend.cmvn_file, out / "am.mvn")
    else:  # funasr-onnx always applies am.mvn: shift 0, scale 1 leaves the features as PyTorch sees them
        dim = frontend.output_size()
        write_am_mvn(out / "am.mvn", np.zeros(dim), np.ones(dim))
    files = [out / "config.yaml", out / "am.mvn", out / "tokens.json"]
    bpemodel = getattr(tokenizer, "bpemodel", None)
    if bpemodel:
        # funasr-onnx looks for a family's released tokenizer under its released file name.
        name = model_file_name(spec.tokenizer_kind) if spec.tokenizer_kind else Path(bpemodel).name
        shutil.copyfile(bpemodel, out / name)
        cfg.tokenizer_conf.bpemodel = name
        files.append(out / name)
        if spec.decoding == PARAFORMER and "lang" not in cfg:
            cfg.lang = "en-bpe"  # funasr-onnx's post-processing for sentencepiece pieces
    elif OmegaConf.select(cfg, "tokenizer_conf.token_list"):
        cfg.tokenizer_conf.token_list = "tokens.json"
    tokens = json.dumps(_vocabulary(tokenizer), ensure_ascii=False, indent=0)
    (out / "tokens.json").write_text(tokens + "\n", encoding="utf-8")
    OmegaConf.save(cfg, out / "config.yaml")
    return files


def write_export_info(out: Path, family: str, model_dir: Path, files: list[Path], seconds: float) -> None:
    """export.json: what was exported from where, the files' sizes, how long it took, the versions."""
    (out / "export.json").write_text(json.dumps({
        "family": family, "name": served_name(model_dir), "model_dir": str(model_dir.resolve()),
        "opset": OPSET,
        "quantization": "onnxruntime quantize_dynamic: MatMul weights, per channel, QUInt8 (funasr's)",
        "files": {f.name: f.stat().st_size for f in files}, "export_seconds": round(seconds, 1),
        "versions": versions("torch", "funasr", "onnx", "onnxruntime", "funasr-onnx")}, indent=2) + "\n",
        encoding="utf-8")
