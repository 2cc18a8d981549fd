"""What a DeepSpeed JSON asks of ZeRO: the stage, and what it offloads from the GPU to CPU memory (or
NVMe): the optimizer (fp32 master weights, Adam's moments, its step) and, under ZeRO-3 only, the
parameters. The memory plan (train/memory.py) and the optimizer swap for offload (compat/offload.py)
read it.

Reads a DeepSpeed JSON (``read_ds_config``); writes nothing.

  zero = ZeroSettings.of(read_ds_config(Path("ds_configs/ds_stage3_offload_bf16.json")))
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from funasr_recipe.core.rejections import BadInputError


def read_ds_config(path: Path) -> dict[str, Any]:
    """The DeepSpeed JSON at ``path``; BadInputError naming the file and line when it is not JSON."""
    try:
        conf = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise BadInputError(f"{path}:{e.lineno}:{e.colno}: not valid JSON ({e.msg})") from None
    if not isinstance(conf, dict):
        raise BadInputError(f"{path}: a DeepSpeed config is a JSON object, not {type(conf).__name__}")
    return conf


def _offloaded(zero: dict[str, Any], key: str) -> bool:
    """DeepSpeed's ``offload_<what>.device``: "cpu" or "nvme" moves it off the GPU, "none" (its default)
    keeps it there."""
    section = zero.get(key)
    return isinstance(section, dict) and str(section.get("device", "none")).lower() not in ("none", "")


@dataclass(frozen=True)
class ZeroSettings:
    stage: int
    offload_optimizer: bool = False
    offload_param: bool = False  # DeepSpeed honours it under ZeRO-3 only

    @classmethod
    def of(cls, conf: dict[str, Any]) -> ZeroSettings:
        zero = conf.get("zero_optimization") or {}
        stage = int(zero.get("stage", 0))
        params = stage == 3 and _offloaded(zero, "offload_param")
        return cls(stage, _offloaded(zero, "offload_optimizer"), params)

    def describe(self) -> str:
        """``ZeRO-3, optimizer and parameters offloaded``: how the memory plan names the setting."""
        what = [w for w, on in (("optimizer", self.offload_optimizer), ("parameters", self.offload_param))
                if on]
        return f"ZeRO-{self.stage}" + (f", {' and '.join(what)} offloaded" if what else "")
