"""A Triton server's handling of a model repository, on this machine's CPU, for the tests of stage 5's
Triton repositories (tests/unit/packaging/test_triton_ensemble.py): configs read with Triton's own schema
(tritonclient's
model_config_pb2), ensembles checked by the rules tritonserver applies when it loads one (core's
ensemble_utils.cc ValidateEnsembleConfig), and models run as the server runs them: python-backend models
through their ``execute`` with a fake ``triton_python_backend_utils`` in sys.modules (what the python
backend's stub process provides, as far as the models use it), onnxruntime-backend ones through
onnxruntime with the configs' reshapes, ensembles step by step over all their requests at once.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from google.protobuf import json_format, text_format

model_config_pb2 = pytest.importorskip(
    "tritonclient.grpc.model_config_pb2", reason="needs tritonclient[grpc]==2.41.0 (requirements.txt)")

NUMPY = {"TYPE_FP32": np.float32, "TYPE_FP16": np.float16, "TYPE_INT32": np.int32, "TYPE_INT64": np.int64,
         "TYPE_STRING": np.object_, "TYPE_BOOL": np.bool_}


# -- triton_python_backend_utils, as far as the models use it ------------------------------------------
class FakeTensor:
    def __init__(self, name: str, array: np.ndarray) -> None:
        self._name, self._array = name, np.asarray(array)

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array


class FakeRequest:
    def __init__(self, inputs: list[FakeTensor]) -> None:
        self._inputs = inputs

    def inputs(self) -> list[FakeTensor]:
        return self._inputs


class FakeTritonError(Exception):
    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self._message = message

    def message(self) -> str:
        return self._message


class FakeResponse:
    def __init__(self, output_tensors: list[FakeTensor], error: FakeTritonError | None = None) -> None:
        self._outputs, self._error = output_tensors, error

    def output_tensors(self) -> list[FakeTensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> FakeTritonError | None:
        return self._error


def _by_name(items: list, name: str) -> object | None:
    return next((t for t in items if t.name() == name), None)


def _config_by_name(config: dict, field: str, name: str) -> dict | None:
    return next((t for t in config.get(field, []) if t["name"] == name), None)


def fake_backend_utils() -> types.ModuleType:
    m = types.ModuleType("triton_python_backend_utils")
    m.Tensor, m.InferenceRequest, m.InferenceResponse, m.TritonError = (FakeTensor, FakeRequest, FakeResponse,
                                                                         FakeTritonError)
    m.get_input_tensor_by_name = lambda request, name: _by_name(request.inputs(), name)
    m.get_output_tensor_by_name = lambda response, name: _by_name(response.output_tensors(), name)
    m.get_input_config_by_name = lambda config, name: _config_by_name(config, "input", name)
    m.get_output_config_by_name = lambda config, name: _config_by_name(config, "output", name)
    m.triton_string_to_numpy = NUMPY.__getitem__
    return m


# -- a repository run as tritonserver runs it ----------------------------------------------------------
def read_configs(repo: Path) -> dict[str, object]:
    return {p.parent.name: text_format.Parse(p.read_text(), model_config_pb2.ModelConfig())
            for p in sorted(repo.glob("*/config.pbtxt"))}


def type_name(t: object) -> str:
    return model_config_pb2.DataType.Name(t.data_type)


def check_tensor(t: object, array: np.ndarray, batched: bool, where: str) -> None:
    """An array as Triton would accept it for the config's tensor ``t``: its type, and its dims after the
    batch axis (-1: any)."""
    assert array.dtype == NUMPY[type_name(t)], f"{where} {t.name}: {array.dtype}, config {type_name(t)}"
    shape = array.shape[1:] if batched else array.shape
    dims = list(t.dims)
    assert len(shape) == len(dims) and all(d in (-1, s) for d, s in zip(dims, shape, strict=True)), \
        f"{where} {t.name}: shape {array.shape}, config dims {dims}"


class Server:
    """The models of one repository on this machine's CPU: python models through their ``execute``,
    encoders through onnxruntime, ensembles step by step over all their requests at once."""

    def __init__(self, repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.repo, self.configs = repo, read_configs(repo)
        monkeypatch.setitem(sys.modules, "triton_python_backend_utils", fake_backend_utils())
        monkeypatch.setattr(sys, "path", list(sys.path))  # the models put the package's runtime/ first
        self.loaded: dict[str, object] = {}

    def _load(self, name: str) -> object:
        if name not in self.loaded:
            config = self.configs[name]
            if config.backend == "python":  # as the python backend does: model.py by path, then initialize
                path = self.repo / name / "1" / "model.py"
                spec = importlib.util.spec_from_file_location(f"triton_{name}", path)
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
                model = module.TritonPythonModel()
                as_json = json_format.MessageToDict(config, preserving_proto_field_name=True)
                model.initialize({"model_config": json.dumps(as_json), "model_name": name,
                                  "model_repository": str(self.repo / name), "model_version": "1",
                                  "model_instance_kind": "CPU", "model_instance_device_id": "0"})
                self.loaded[name] = model
            else:
                self.loaded[name] = ort.InferenceSession(str(self.repo / name / "1" / "model.onnx"),
                                                         providers=["CPUExecutionProvider"])
        return self.loaded[name]

    def infer(self, name: str, requests: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        config = self.configs[name]
        batched = config.max_batch_size > 0
        for request in requests:
            assert set(request) <= {t.name for t in config.input}, f"{name}: inputs {sorted(request)}"
            for t in config.input:
                assert t.name in request or t.optional, f"{name}: required input {t.name} missing"
                if t.name in request:
                    check_tensor(t, request[t.name], batched, name)
                    assert not batched or len(request[t.name]) <= config.max_batch_size
        if config.platform == "ensemble":
            results = [dict(r) for r in requests]
            for step in config.ensemble_scheduling.step:
                fed = [{k: r[v] for k, v in step.input_map.items() if v in r} for r in results]
                for r, out in zip(results, self.infer(step.model_name, fed), strict=True):
                    r.update({step.output_map[k]: v for k, v in out.items() if k in step.output_map})
            outputs = [{t.name: r[t.name] for t in config.output} for r in results]
        elif config.backend == "python":
            responses = self._load(name).execute(
                [FakeRequest([FakeTensor(k, v) for k, v in r.items()]) for r in requests])
            assert len(responses) == len(requests)
            errors = [r.error().message() for r in responses if r.has_error()]
            assert not errors, f"{name}: {errors}"
            outputs = [{t.name(): t.as_numpy() for t in r.output_tensors()} for r in responses]
        else:
            session, outputs = self._load(name), []
            for r in requests:  # what the backend gives the graph: each input reshaped as configured
                shaped = {t.name: r[t.name].reshape(len(r[t.name]), *t.reshape.shape) if t.HasField("reshape")
                          else r[t.name] for t in config.input}
                values = session.run([t.name for t in config.output], shaped)
                outputs.append({t.name: v.reshape(len(v), *t.dims) if t.HasField("reshape") else v
                                for t, v in zip(config.output, values, strict=True)})
        for out in outputs:
            assert set(out) == {t.name for t in config.output}, f"{name}: outputs {sorted(out)}"
            for t in config.output:
                check_tensor(t, out[t.name], batched, name)
        return outputs


def ensemble_problems(configs: dict[str, object], name: str) -> list[str]:
    """What tritonserver refuses in an ensemble when it loads it (core's ValidateEnsembleConfig), and an
    optional ensemble input that feeds a required model input (the request would fail at run time)."""
    ens, problems = configs[name], []
    batching = ens.max_batch_size > 0
    seen: dict[str, tuple[str, list[int], list[int]]] = {}

    def dims_of(t: object, model_batching: bool, reshape_counts: bool) -> tuple[list[int], list[int]]:
        dims = list(t.reshape.shape if reshape_counts and t.HasField("reshape") else t.dims)
        return dims, ([-1] if model_batching else []) + dims

    def agree(a: list[int], b: list[int]) -> bool:
        return len(a) == len(b) and all(x == y or -1 in (x, y) for x, y in zip(a, b, strict=True))

    def meet(tensor: str, kind: str, dims: tuple[list[int], list[int]], where: str) -> None:
        if tensor not in seen:
            seen[tensor] = (kind, *dims)
            return
        other = seen[tensor]
        if other[0] != kind:
            problems.append(f"{where}: {tensor} is {kind} here, {other[0]} elsewhere")
        elif not agree(other[1], dims[0]) and not agree(other[2], dims[1]):
            problems.append(f"{where}: {tensor} has dims {dims[1]} here, {other[2]} elsewhere")

    for t in ens.input:
        meet(t.name, type_name(t), dims_of(t, batching, True), name)
    optional = {t.name for t in ens.input if t.optional}
    available = {t.name for t in ens.input}
    steps = list(ens.ensemble_scheduling.step)
    for step in steps:
        model = configs.get(step.model_name)
        if model is None:
            problems.append(f"{name}: step model {step.model_name} is not in the repository")
            continue
        where = f"{name} -> {step.model_name}"
        if 0 < model.max_batch_size < ens.max_batch_size:
            problems.append(f"{where}: max batch {model.max_batch_size} < {ens.max_batch_size}")
        inputs = {t.name: t for t in model.input}
        outputs = {t.name: t for t in model.output}
        problems += [f"{where}: maps to non-existing input {k}" for k in step.input_map if k not in inputs]
        problems += [f"{where}: maps from non-existing output {k}"
                     for k in step.output_map if k not in outputs]
        for k, t in inputs.items():
            if k not in step.input_map:
                if not t.optional:
                    problems.append(f"{where}: input {k} is not mapped")
                continue
            meet(step.input_map[k], type_name(t), dims_of(t, model.max_batch_size > 0, False), where)
            if step.input_map[k] in optional and not t.optional:
                problems.append(f"{where}: optional {step.input_map[k]} feeds required input {k}")
        for k, v in step.output_map.items():
            if k in outputs:
                meet(v, type_name(outputs[k]), dims_of(outputs[k], model.max_batch_size > 0, False), where)
    pending = steps[:]  # data flow: each step runs once all its mapped inputs exist
    while pending:
        ready = [s for s in pending if set(s.input_map.values()) <= available]
        if not ready:
            problems.append(f"{name}: steps {[s.model_name for s in pending]} wait on tensors never made")
            break
        for s in ready:
            available |= set(s.output_map.values())
            pending.remove(s)
    for t in ens.output:
        meet(t.name, type_name(t), dims_of(t, batching, True), name)
        if t.name not in available:
            problems.append(f"{name}: output {t.name} is produced by no step")
    return problems
