"""Deployment files of stage 5 derived from an ONNX model's own inputs and outputs: Triton model
configurations (onnxruntime backend; the python-backend and ensemble models of triton_ensemble.py are
written with the same tensor syntax) and a trtexec script that builds a TensorRT engine.

Reads an ONNX model's graph inputs/outputs (names, element types, dynamic axes); returns the text of
  <repo>/<name>/config.pbtxt                                one Triton model (config_pbtxt,
                                                            python_pbtxt, ensemble_pbtxt)
  build_trt.sh                                              trtexec with min/opt/max shapes and --fp16
Names, types and shapes in both come from the model (``onnx_io``), never from a template, so that a
re-exported model with other inputs (SenseVoice's language/textnorm, Paraformer's token_num) stays
consistent. Triton's text format is written by hand (no tritonclient at run time); tests parse it with
Triton's own protobuf schema (tritonclient.grpc.model_config_pb2).

Triton's dynamic batcher concatenates requests along the batch axis only when their other dims are
equal, so clients should pad speech to a few length buckets (the model takes the true speech_lengths).
A 1-D per-utterance tensor (speech_lengths, language, ...) is declared dims [1] with reshape [] as
Triton requires for batched models.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass
from pathlib import Path

import onnx
from onnx import TensorProto, helper

TRITON_TYPES = {TensorProto.FLOAT: "TYPE_FP32", TensorProto.FLOAT16: "TYPE_FP16",
                TensorProto.INT32: "TYPE_INT32", TensorProto.INT64: "TYPE_INT64",
                TensorProto.BOOL: "TYPE_BOOL", TensorProto.INT8: "TYPE_INT8", TensorProto.UINT8: "TYPE_UINT8",
                TensorProto.STRING: "TYPE_STRING"}


@dataclass(frozen=True)
class Tensor:
    """One graph input or output: name, ONNX element type and dims (None for a dynamic axis); an
    ``optional`` input may be left out of a request (python-backend and ensemble models only)."""

    name: str
    elem_type: int
    dims: tuple[int | None, ...]
    optional: bool = False

    @property
    def batched(self) -> bool:
        return bool(self.dims) and self.dims[0] is None


def onnx_io(path: Path) -> tuple[list[Tensor], list[Tensor]]:
    """(inputs, outputs) of an ONNX model, read without loading its weights."""
    model = onnx.load(str(path), load_external_data=False)

    def tensors(values: list) -> list[Tensor]:
        out = []
        for v in values:
            t = v.type.tensor_type
            dims = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None
                         for d in t.shape.dim)
            out.append(Tensor(v.name, t.elem_type, dims))
        return out
    initializers = {i.name for i in model.graph.initializer}
    return tensors([v for v in model.graph.input if v.name not in initializers]), tensors(model.graph.output)


def _tensor_pbtxt(t: Tensor, batched: bool) -> str:
    dims = list(t.dims[1:] if batched else t.dims)
    kind = TRITON_TYPES[t.elem_type]
    head = f'  {{\n    name: "{t.name}"\n    data_type: {kind}\n'
    if t.optional:
        head += "    optional: true\n"
    if not dims:  # (batch,) tensor: Triton wants at least one dim per item, then reshapes it away
        return head + "    dims: [ 1 ]\n    reshape: { shape: [ ] }\n  }"
    shown = ", ".join(str(-1 if d is None else d) for d in dims)
    return head + f"    dims: [ {shown} ]\n  }}"


def config_pbtxt(name: str, inputs: list[Tensor], outputs: list[Tensor], max_batch: int, kind: str,
                 tensorrt_fp16: bool = False, queue_delay_us: int = 5000) -> str:
    """Triton's config.pbtxt for an onnxruntime-backend model whose graph has ``inputs``/``outputs``."""
    batched = all(t.batched for t in inputs + outputs)
    lines = _head(name, 'backend: "onnxruntime"', inputs, outputs, max_batch if batched else 0)
    if batched:
        preferred = sorted({b for b in (8, max_batch) if b <= max_batch})
        lines += ["dynamic_batching {", f"  preferred_batch_size: [ {', '.join(map(str, preferred))} ]",
                  f"  max_queue_delay_microseconds: {queue_delay_us}", "}"]
    lines += _instances(kind, 1)
    if tensorrt_fp16:  # onnxruntime's TensorRT execution provider, computing in fp16
        lines += ["optimization {", "  execution_accelerators {", "    gpu_execution_accelerator: [ {",
                  '      name: "tensorrt"',
                  '      parameters { key: "precision_mode" value: "FP16" }',
                  '      parameters { key: "max_workspace_size_bytes" value: "1073741824" }',
                  '      parameters { key: "trt_engine_cache_enable" value: "1" }',
                  "    } ]", "  }", "}"]
    return "\n".join(lines) + "\n"


def _head(name: str, runner: str, inputs: list[Tensor], outputs: list[Tensor], max_batch: int) -> list[str]:
    """The name, backend or platform, batch size and I/O lines every config starts with."""
    batched = max_batch > 0
    return [f'name: "{name}"', runner, f"max_batch_size: {max_batch}",
            "input [", ",\n".join(_tensor_pbtxt(t, batched) for t in inputs), "]",
            "output [", ",\n".join(_tensor_pbtxt(t, batched) for t in outputs), "]"]


def _instances(kind: str, count: int) -> list[str]:
    return ["instance_group [", f"  {{\n    count: {count}\n    kind: {kind}\n  }}", "]"]


def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def python_pbtxt(name: str, inputs: list[Tensor], outputs: list[Tensor], max_batch: int,
                 parameters: dict[str, str], count: int = 1) -> str:
    """config.pbtxt of a python-backend model (1/model.py beside it): batched I/O, string ``parameters``
    (the model reads them from its config), CPU instances, and a dynamic batcher without delay, which
    hands the model every request already queued in one ``execute`` call."""
    lines = _head(name, 'backend: "python"', inputs, outputs, max_batch)
    lines += ["parameters ["]
    lines += [",\n".join(f"  {{\n    key: {_quoted(k)}\n    value: {{ string_value: {_quoted(v)} }}\n  }}"
                          for k, v in parameters.items())]
    lines += ["]", "dynamic_batching { }"] + _instances("KIND_CPU", count)
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Step:
    """One step of an ensemble: a model and its tensors' names (model's own -> the ensemble's)."""

    model: str
    inputs: dict[str, str]
    outputs: dict[str, str]


def ensemble_pbtxt(name: str, inputs: list[Tensor], outputs: list[Tensor], max_batch: int,
                   steps: list[Step]) -> str:
    """config.pbtxt of an ensemble that runs ``steps`` (latest version of each model) in data order."""
    lines = _head(name, 'platform: "ensemble"', inputs, outputs, max_batch)
    blocks = []
    for step in steps:
        maps = [f"      {kind}_map {{ key: {_quoted(k)} value: {_quoted(v)} }}"
                for kind, mapping in (("input", step.inputs), ("output", step.outputs))
                for k, v in mapping.items()]
        blocks.append("\n".join(["    {", f"      model_name: {_quoted(step.model)}",
                                 "      model_version: -1", *maps, "    }"]))
    lines += ["ensemble_scheduling {", "  step [", ",\n".join(blocks), "  ]", "}"]
    return "\n".join(lines) + "\n"


def fp16_io(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with float16 graph inputs and outputs, cast to and from float32 at the edges.

    Halves what crosses the wire (the (batch, frames, vocab) logits dominate: 25055 floats a frame for
    SenseVoice) and gives TensorRT's fp16 mode fp16 tensors at both ends; the weights and the
    onnxruntime CPU arithmetic stay fp32. A full fp16 conversion (onnxconverter-common 1.16) breaks
    funasr's graphs ("Type (tensor(float16)) ... does not match expected type (tensor(float))" at the
    encoder's Cast), so the casts are only at the edges.
    """
    graph = model.graph
    renamed: dict[str, str] = {}
    head, tail = [], []
    for v in graph.input:
        if v.type.tensor_type.elem_type == TensorProto.FLOAT:
            renamed[v.name] = f"{v.name}__fp32"
            head.append(helper.make_node("Cast", [v.name], [renamed[v.name]], to=TensorProto.FLOAT,
                                         name=f"{v.name}__to_fp32"))
            v.type.tensor_type.elem_type = TensorProto.FLOAT16
    for node in graph.node:
        node.input[:] = [renamed.get(i, i) for i in node.input]
    for v in graph.output:
        if v.type.tensor_type.elem_type == TensorProto.FLOAT:
            inner = f"{v.name}__fp32"
            for node in graph.node:
                node.output[:] = [inner if o == v.name else o for o in node.output]
                node.input[:] = [inner if i == v.name else i for i in node.input]
            tail.append(helper.make_node("Cast", [inner], [v.name], to=TensorProto.FLOAT16,
                                         name=f"{v.name}__to_fp16"))
            v.type.tensor_type.elem_type = TensorProto.FLOAT16
    nodes = head + list(graph.node) + tail
    del graph.node[:]
    graph.node.extend(nodes)
    return model


def trt_shapes(inputs: list[Tensor], frames: tuple[int, int, int],
               batches: tuple[int, int, int]) -> tuple[str, str, str]:
    """trtexec's --minShapes/--optShapes/--maxShapes values: batch axis from ``batches``, every other
    dynamic axis (time) from ``frames``, fixed axes as the model has them."""
    out = []
    for k in range(3):
        parts = []
        for t in inputs:
            dims = [batches[k] if i == 0 and d is None else frames[k] if d is None else d
                    for i, d in enumerate(t.dims)]
            parts.append(f"{t.name}:{'x'.join(map(str, dims))}")
        out.append(",".join(parts))
    return out[0], out[1], out[2]


def model_frames(seconds: float, lfr_n: int, frame_shift_ms: float = 10.0) -> int:
    """Model input frames of ``seconds`` of audio: 10 ms fbank frames, one in ``lfr_n`` kept by LFR."""
    return max(1, math.ceil(seconds * 1000 / frame_shift_ms / lfr_n))


def build_trt_script(onnx_rel: str, shapes: tuple[str, str, str], seconds: tuple[float, float, float],
                     engine_rel: str = "model_fp16.plan") -> str:
    """build_trt.sh: trtexec --fp16 with the shapes; a clear message and exit 1 where trtexec is missing."""
    q = shlex.quote
    return f"""#!/usr/bin/env bash
# Build a TensorRT engine from {onnx_rel} with trtexec: fp16, one optimisation profile whose shapes come
# from the model's inputs (speech of {seconds[0]:g} s / {seconds[1]:g} s / {seconds[2]:g} s).
# Usage: ./build_trt.sh [engine file (default: {engine_rel} next to this script)] [more trtexec options]
# trtexec: $TRTEXEC, else trtexec on PATH, else TensorRT's usual install dirs.
set -euo pipefail
here=$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)
trtexec=${{TRTEXEC:-}}
if [ -z "$trtexec" ]; then
  for candidate in "$(command -v trtexec || true)" /usr/src/tensorrt/bin/trtexec /opt/tensorrt/bin/trtexec; do
    if [ -n "$candidate" ] && [ -x "$candidate" ]; then trtexec=$candidate; break; fi
  done
fi
if [ -z "$trtexec" ] || [ ! -x "$trtexec" ]; then
  echo "build_trt.sh: trtexec not found. It comes with TensorRT (NVIDIA's TensorRT and Triton" >&2
  echo "containers have it at /usr/src/tensorrt/bin/trtexec): install TensorRT or set" >&2
  echo "TRTEXEC=/path/to/trtexec, then rerun." >&2
  exit 1
fi
engine=${{1:-$here/{engine_rel}}}
[ $# -gt 0 ] && shift
MIN_SHAPES={q(shapes[0])}
OPT_SHAPES={q(shapes[1])}
MAX_SHAPES={q(shapes[2])}
exec "$trtexec" --onnx="$here/{onnx_rel}" --saveEngine="$engine" --fp16 \\
  --minShapes="$MIN_SHAPES" --optShapes="$OPT_SHAPES" --maxShapes="$MAX_SHAPES" "$@"
"""
