"""funasr-onnx, the deployment runtime FunASR ships, on an export dir: to check that the export loads
in it (stage 4) and to compare with it (stage 5's benchmark). Not the recipe's inference path
(runtime/onnx_asr.py is): funasr-onnx has no CTC-only class, so ConformerCTC has no funasr-onnx side.

  model = load_funasr_onnx(Path("exp/x/export"), "SenseVoiceSmall", quantize=False, threads=2)
  [runtime_text(r) for r in model(["a.wav"])]
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from funasr_recipe.core.rejections import BadInputError
from funasr_recipe.families.registry import FUNASR_ONNX, supporting

FUNASR_ONNX_FAMILIES = supporting(FUNASR_ONNX)  # funasr-onnx has a class of the family's name


def load_funasr_onnx(export_dir: Path, family: str, quantize: bool, threads: int, batch_size: int = 1) -> Any:
    """funasr-onnx's class for the family on an export dir; NotImplementedError for one it lacks."""
    if family not in FUNASR_ONNX_FAMILIES:
        raise BadInputError(f"funasr-onnx has no class for {family} (it has "
                            f"{', '.join(FUNASR_ONNX_FAMILIES)})")
    import funasr_onnx

    return getattr(funasr_onnx, family)(str(export_dir), batch_size=batch_size, quantize=quantize,
                                        intra_op_num_threads=threads)


def runtime_text(result: Any) -> str:
    """The transcript in one result of funasr-onnx: a str, or Paraformer's {"preds": (text, words)}."""
    return result["preds"][0] if isinstance(result, dict) else result


def funasr_onnx_check(export_dir: Path, family: str, sources: list[str], threads: int) -> dict:
    """Load the export dir in funasr-onnx as a deployment would, fp32 and int8, and transcribe a few files;
    for a family funasr-onnx lacks, say so instead."""
    if family not in FUNASR_ONNX_FAMILIES:
        return {"runtime": None, "note": f"funasr-onnx has no class for {family}"}
    report: dict = {"runtime": f"funasr_onnx.{family}"}
    for name, quantize in (("fp32", False), ("int8", True)):
        model = load_funasr_onnx(export_dir, family, quantize, threads)
        report[name] = [runtime_text(r) for r in model(sources)]
    return report
