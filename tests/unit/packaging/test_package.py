"""Stage 5: local/package.py, local/bench_runtime.py and the runtime they ship (runtime/onnx_asr.py), on
tiny random-init models of each family exported by local/export.py (tests/helpers/model_dirs.py).

Random weights emit garbage, but every path from the same audio file must emit the same garbage: our
ONNX runtime, funasr's AutoModel.generate (PyTorch) and funasr-onnx. The clips are the bundled digits
resampled once to 16 kHz, so that no path's resampler (torchaudio's sinc in ours and AutoModel's,
soxr in funasr-onnx's librosa.load) enters the comparison. Triton's configs are parsed with Triton's own
protobuf schema (tritonclient's model_config_pb2). No timing is asserted.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort
import pytest
import soundfile as sf
import torch
from funasr_onnx.utils.postprocess_utils import sentence_postprocess_sentencepiece

from funasr_recipe.data.tags import strip_tags
from funasr_recipe.features.audio import load_audio
from funasr_recipe.features.cmvn import read_am_mvn, write_am_mvn
from funasr_recipe.features.fbank import FbankConf, FbankExtractor
from funasr_recipe.model.model_dir import load_automodel
from funasr_recipe.packaging.package import runtime_files
from funasr_recipe.packaging.triton_repo import TRITON_TYPES, onnx_io
from funasr_recipe.runtime.funasr_onnx_runtime import FUNASR_ONNX_FAMILIES, load_funasr_onnx, runtime_text
from funasr_recipe.runtime.onnx_asr import OnnxASR
from local.bench_runtime import main as bench_main
from local.package import main as package_main
from tests.helpers.data16k import N_UTTS
from tests.helpers.packaged import package_env, package_server


def _sources(data_jsonl: Path) -> tuple[list[str], list[str]]:
    rows = [json.loads(line) for line in data_jsonl.read_text().splitlines()]
    return [r["source"] for r in rows], [r["key"] for r in rows]


@pytest.mark.parametrize("batch", [1, 4])
def test_runtime_emits_what_automodel_and_funasr_onnx_emit(exp: tuple[str, Path], data16k: Path,
                                                           batch: int) -> None:
    """Ours (from the package's onnx/, as deployed) == AutoModel.generate on the same files in the same
    batches (padding included). funasr-onnx's frontend (kaldi-native-fbank) differs from PyTorch's by
    ~1e-4, enough to flip a random model's near-tied tokens: so its features are compared with ours
    numerically, and our session and decoding on ITS features must give its texts, fp32 and int8.
    (funasr-onnx has no ConformerCTC class: that family is compared with AutoModel only.)"""
    family, exp_dir = exp
    sources, keys = _sources(data16k)
    onnx_dir = exp_dir / "package" / "onnx"
    ours = OnnxASR(onnx_dir, threads=2, batch_size=batch)(sources)
    automodel = load_automodel(exp_dir / "final", "cpu")
    results = automodel.generate(input=sources, key=keys, batch_size=batch, language="auto", use_itn=False,
                                 disable_pbar=True)
    ref = {r["key"]: r["text"] for r in results}
    assert ours == [ref.get(k, "") for k in keys]
    assert any(ours), "random weights should emit some tokens"
    if family not in FUNASR_ONNX_FAMILIES:
        return
    waves = [load_audio(s)[0][:, 0] for s in sources]
    for quantize in (False, True):
        theirs = load_funasr_onnx(onnx_dir, family, quantize, threads=2, batch_size=batch)
        runtime = OnnxASR(onnx_dir, quantize=quantize, threads=2, batch_size=batch)
        texts, expected = [], [runtime_text(r) for r in theirs(sources)]
        for start in range(0, len(waves), batch):
            feats, lengths = theirs.extract_feat(waves[start:start + batch])  # funasr-onnx's WavFrontend
            mine = runtime.features(waves[start:start + batch])
            assert [len(f) for f in mine] == lengths.tolist()
            assert max(float(np.abs(f - feats[i, : len(f)]).max()) for i, f in enumerate(mine)) < 1e-3
            scores, out_lens = runtime.infer([feats[i, :n] for i, n in enumerate(lengths.tolist())])
            if family == "Paraformer":
                # funasr-onnx's Paraformer decodes its own way: it drops the last predicted token when the
                # model's predictor_bias is 1 (the predictor counts </s>), which AutoModel (and ours) keeps,
                # and a random model's last token is not </s>. So its rule, on our scores.
                texts += [sentence_postprocess_sentencepiece(t)[0] for t in theirs.decode(scores, out_lens)]
            else:
                texts += [runtime.decode(s, int(n)) for s, n in zip(scores, out_lens.tolist(), strict=True)]
        assert texts == expected


def test_runtime_cli_and_arrays(exp: tuple[str, Path], data16k: Path) -> None:
    _, exp_dir = exp
    sources, _ = _sources(data16k)
    asr = OnnxASR(exp_dir / "package" / "onnx", threads=1)
    assert asr([load_audio(s)[0][:, 0] for s in sources[:2]]) == asr(sources[:2])  # arrays: 16 kHz
    # The package's runtime/ alone (the recipe's checkout is not on the path): the files it ships are the
    # runtime entry and what it imports, found from the imports.
    runtime = exp_dir / "package" / "runtime"
    shipped = {str(p.relative_to(runtime)) for p in runtime.rglob("*") if p.is_file()} - {"requirements.txt"}
    assert shipped == {str(f) for f in runtime_files()}
    assert {"funasr_recipe/serving/cli.py", "funasr_recipe/serving/static/index.html",
            "funasr_recipe/serving/static/app.js"} <= shipped
    assert "funasr_recipe/runtime/transcribe.py" in shipped and "funasr_recipe/model/config.py" not in shipped
    out = subprocess.run([sys.executable, "-m", "funasr_recipe.runtime.transcribe",
                          str(exp_dir / "package" / "onnx"), *sources[:2], "--threads", "1"],
                         cwd=exp_dir, env=package_env(exp_dir / "package"), capture_output=True, text=True,
                         check=True).stdout
    assert out.splitlines() == [f"{s}\t{t}" for s, t in zip(sources[:2], asr(sources[:2]), strict=True)]
    requirements = (runtime / "requirements.txt").read_text().split()
    assert {r.split("==")[0] for r in requirements if "==" in r} >= {"numpy", "onnxruntime", "soundfile",
                                                                     "fastapi", "uvicorn", "python-multipart"}


@pytest.mark.slow  # starts the package's HTTP server for each family
def test_package_serves_over_http(exp: tuple[str, Path], data16k: Path) -> None:
    """The HTTP service from the package's runtime/ alone, as its card says to start it."""
    _, exp_dir = exp
    pkg = exp_dir / "package"
    sources, _ = _sources(data16k)
    with package_server(pkg, sys.executable) as url:
        texts = [httpx.post(f"{url}/v1/transcriptions", files={"file": Path(s).read_bytes()},
                            timeout=30).json()["text"] for s in sources[:2]]
        assert texts == [strip_tags(t) for t in OnnxASR(pkg / "onnx", threads=1)(sources[:2])]
        assert "<canvas" in httpx.get(url, timeout=5).text  # the web page shipped too
        assert "transcriptions" in httpx.get(f"{url}/static/app.js", timeout=5).text


def test_triton_configs_parse_with_tritons_schema(exp: tuple[str, Path]) -> None:
    model_config_pb2 = pytest.importorskip(
        "tritonclient.grpc.model_config_pb2", reason="needs tritonclient[grpc]==2.41.0 (requirements.txt)")
    from google.protobuf import text_format

    _, exp_dir = exp
    tag = exp_dir.name
    # The encoders; tests/unit/packaging/test_triton_ensemble.py covers the rest of both repositories.
    repos = {tag: "triton", f"{tag}_int8": "triton", f"{tag}_fp16": "triton_gpu"}
    for name, repo_name in repos.items():
        repo = exp_dir / "package" / repo_name
        config = text_format.Parse((repo / name / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
        inputs, outputs = onnx_io(repo / name / "1" / "model.onnx")
        assert config.name == name and config.backend == "onnxruntime" and config.max_batch_size == 32
        assert list(config.dynamic_batching.preferred_batch_size) == [8, 32]
        kind = {tag: "KIND_AUTO", f"{tag}_int8": "KIND_CPU", f"{tag}_fp16": "KIND_GPU"}[name]
        assert model_config_pb2.ModelInstanceGroup.Kind.Name(config.instance_group[0].kind) == kind
        for declared, actual in ((config.input, inputs), (config.output, outputs)):
            assert [t.name for t in declared] == [t.name for t in actual]
            for t, a in zip(declared, actual, strict=True):
                assert model_config_pb2.DataType.Name(t.data_type) == TRITON_TYPES[a.elem_type]
                assert a.dims[0] is None  # the batch axis, which Triton leaves out
                expected = [-1 if d is None else d for d in a.dims[1:]]
                if expected:
                    assert list(t.dims) == expected and not t.HasField("reshape")
                else:  # (batch,) tensors
                    assert list(t.dims) == [1] and list(t.reshape.shape) == []
        speech = next(t for t in config.input if t.name == "speech")
        assert list(speech.dims)[0] == -1  # dynamic time axis
        fp16 = name.endswith("_fp16")
        assert model_config_pb2.DataType.Name(speech.data_type) == ("TYPE_FP16" if fp16 else "TYPE_FP32")
        accelerators = config.optimization.execution_accelerators.gpu_execution_accelerator
        trt = [(a.name, a.parameters["precision_mode"]) for a in accelerators]
        assert trt == ([("tensorrt", "FP16")] if fp16 else [])


def test_fp16_io_model_gives_the_fp32_scores(exp: tuple[str, Path], data16k: Path) -> None:
    family, exp_dir = exp
    pkg = exp_dir / "package"
    asr = OnnxASR(pkg / "onnx", threads=1)
    feats = asr.features(_sources(data16k)[0][:2])
    ref, ref_lens = asr.infer(feats)
    fp16 = ort.InferenceSession(str(pkg / "triton_gpu" / f"{exp_dir.name}_fp16" / "1" / "model.onnx"),
                                providers=["CPUExecutionProvider"])
    lengths = np.array([len(f) for f in feats], dtype=np.int32)
    batch = np.zeros((2, lengths.max(), feats[0].shape[1]), dtype=np.float16)
    for i, f in enumerate(feats):
        batch[i, : len(f)] = f
    inputs = {"speech": batch, "speech_lengths": lengths, "language": np.zeros(2, np.int32),
              "textnorm": np.full(2, 15, np.int32)}
    scores, lens = fp16.run(None, {i.name: inputs[i.name] for i in fp16.get_inputs()})[:2]
    assert scores.dtype == np.float16 and lens.tolist() == ref_lens.tolist()
    # fp16 inputs carry ~3 significant digits: the scores follow them to that precision.
    assert np.abs(scores.astype(np.float32) - ref).max() < 0.02 * max(1.0, np.abs(ref).max())


def test_build_trt_script_shapes(exp: tuple[str, Path], tmp_path: Path) -> None:
    _, exp_dir = exp
    script = exp_dir / "package" / "build_trt.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    fake = tmp_path / "trtexec"
    fake.write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@"\n')
    fake.chmod(0o755)
    args = subprocess.run(["bash", str(script), str(tmp_path / "x.plan")],
                          env={**os.environ, "TRTEXEC": str(fake)}, capture_output=True, text=True,
                          check=True).stdout.splitlines()
    assert "--fp16" in args and f"--saveEngine={tmp_path / 'x.plan'}" in args
    assert f"--onnx={exp_dir / 'package' / 'onnx' / 'model.onnx'}" in args
    inputs, _ = onnx_io(exp_dir / "package" / "onnx" / "model.onnx")
    profile = {}
    for flag, batch in (("--minShapes", 1), ("--optShapes", 8), ("--maxShapes", 32)):
        value = next(a for a in args if a.startswith(flag + "=")).split("=", 1)[1]
        shapes = dict(part.split(":") for part in value.split(","))
        assert list(shapes) == [t.name for t in inputs]
        for t in inputs:
            dims = [int(d) for d in shapes[t.name].split("x")]
            assert len(dims) == len(t.dims) and dims[0] == batch
            assert all(d == fixed for d, fixed in zip(dims, t.dims, strict=True) if fixed is not None)
        profile[flag] = int(shapes["speech"].split("x")[1])
    assert 0 < profile["--minShapes"] < profile["--optShapes"] < profile["--maxShapes"]
    missing = subprocess.run(["bash", str(script)], env={"PATH": "/usr/bin:/bin"}, capture_output=True,
                             text=True)
    assert missing.returncode == 1 and "trtexec not found" in missing.stderr


def _card_paths(card: str) -> set[str]:
    """Package files the card names: its Files list, and any backticked path under onnx/, triton/,
    triton_gpu/ or runtime/ elsewhere."""
    files = re.findall(r"^- `([^`]+)`:", card.split("## Files", 1)[1].split("\n## ", 1)[0], re.MULTILINE)
    mentioned = re.findall(r"(?<!`)`((?:onnx|triton|triton_gpu|runtime)/[^`\s]+)`", card)
    return set(files) | {m for m in mentioned if not m.endswith("/")}


def test_package_holds_what_the_card_says(exp: tuple[str, Path]) -> None:
    family, exp_dir = exp
    pkg = exp_dir / "package"
    card = (pkg / "README.md").read_text()
    named = _card_paths(card)
    on_disk = {str(p.relative_to(pkg)) for p in pkg.rglob("*") if p.is_file() and p.name != ".done"}
    assert named == on_disk
    assert {"deploy/Containerfile", "deploy/asr.service", "runtime/requirements.txt"} <= on_disk
    assert "pip install -r runtime/requirements.txt" in card
    with tarfile.open(exp_dir / "package.tar.gz") as tar:
        members = {m.name for m in tar.getmembers() if m.isfile() or m.islnk()}
    assert members == {f"{exp_dir.name}/{p}" for p in on_disk}
    sums = subprocess.run(["sha256sum", "-c", "--quiet", "SHA256SUMS"], cwd=pkg, capture_output=True,
                          text=True)
    assert sums.returncode == 0, sums.stdout + sums.stderr
    # What the card reports comes from the run's own files.
    assert f"class `{family}`" in card and "## Data" in card and "`fsdd`" in card
    assert "| avg | dev | 99 |" in card  # RESULTS.md
    assert "100.00%" in card.split("## Export parity")[1].split("\n## ")[0]  # fp32 identical to PyTorch
    assert ("| runtime | precision |" in card) == (family == "SenseVoiceSmall")
    params = int(re.search(r"parameters: ([\d,]+)", card).group(1).replace(",", ""))
    assert params == sum(v.numel() for v in torch.load(exp_dir / "final" / "model.pt").values()
                         if v.is_floating_point())


def test_the_cards_funasr_onnx_example_runs_as_written(exp: tuple[str, Path], data16k: Path) -> None:
    """The card's funasr-onnx example, from the package's top directory with runtime/ on the path, on an
    8 kHz file: the recipe's resampler that it imports is shipped, and its text is the runtime's."""
    family, exp_dir = exp
    pkg = exp_dir / "package"
    blocks = re.findall(r"```python\n(.*?)```", (pkg / "README.md").read_text(), re.DOTALL)
    example = [b for b in blocks if "from funasr_onnx import" in b]
    if family not in FUNASR_ONNX_FAMILIES:
        assert example == []
        return
    wave, rate = load_audio(_sources(data16k)[0][0])
    sf.write(pkg / "a.wav", wave[::2], rate // 2)
    try:
        res = subprocess.run([sys.executable, "-c", example[0]], cwd=pkg, env=package_env(pkg),
                             capture_output=True, text=True, timeout=300)
    finally:
        (pkg / "a.wav").unlink()
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip()


def test_benchmark_report(exp: tuple[str, Path]) -> None:
    family, exp_dir = exp
    if family != "SenseVoiceSmall":
        pytest.skip("benchmarked on SenseVoiceSmall only (the others' rows are the same code)")
    report = json.loads((exp_dir / "benchmark.json").read_text())
    assert report["family"] == family and report["utterances"] == N_UTTS and report["threads"] == 2
    assert report["devices"] == ["cpu"] and report["batch_sizes"] == [1, 4]
    combos = {(r["runtime"], r["precision"], r["batch"]) for r in report["rows"]}
    assert combos == {(rt, p, b) for b in (1, 4) for rt, p in
                      (("pytorch", "fp32"), ("funasr_onnx", "fp32"), ("funasr_onnx", "int8"),
                       ("ours", "fp32"), ("ours", "int8"), ("sherpa_onnx", "fp32"), ("sherpa_onnx", "int8"))}
    for r in report["rows"]:
        assert r["utt_per_s"] > 0 and r["rtf"] > 0 and 0 < r["latency_ms"]["p50"] <= r["latency_ms"]["p95"]
        assert r["speedup_vs_pytorch"] > 0 and 0.0 <= r["same_text_as_pytorch"] <= 1.0
        if r["runtime"] == "ours" and r["precision"] == "fp32":
            assert r["same_text_as_pytorch"] == 1.0
    # The recipe's performance targets are bench/bench_runtime.py's (--targets), not the user's report.
    assert "targets" not in report
    md = (exp_dir / "benchmark.md").read_text()
    assert md.count("\n| ") == 1 + len(report["rows"])
    assert "target" not in md.lower() and "MISSED" not in md


def test_reruns_skip_finished_work(exp: tuple[str, Path], data16k: Path) -> None:
    _, exp_dir = exp
    before = (exp_dir / "package.tar.gz").stat().st_mtime_ns
    assert package_main(["--exp-dir", str(exp_dir), "--data-jsonl", str(data16k)]) == 0
    assert (exp_dir / "package.tar.gz").stat().st_mtime_ns == before
    if (exp_dir / "benchmark.json").is_file():
        before = (exp_dir / "benchmark.json").stat().st_mtime_ns
        assert bench_main(["--exp-dir", str(exp_dir), "--data-jsonl", str(data16k), "--batch-sizes", "1,4",
                           "--threads", "2", "--cpu-only"]) == 0
        assert (exp_dir / "benchmark.json").stat().st_mtime_ns == before


def test_failed_or_missing_export_is_not_packaged(exp: tuple[str, Path], data16k: Path,
                                                  tmp_path: Path) -> None:
    _, exp_dir = exp
    broken = tmp_path / "exp"
    shutil.copytree(exp_dir / "export", broken / "export")
    parity = json.loads((broken / "export" / "parity.json").read_text())
    (broken / "export" / "parity.json").write_text(json.dumps({**parity, "pass": False}))
    assert package_main(["--exp-dir", str(broken), "--data-jsonl", str(data16k)]) == 2
    assert not (broken / "package.tar.gz").exists()
    assert package_main(["--exp-dir", str(tmp_path / "none"), "--data-jsonl", str(data16k)]) == 2
    assert bench_main(["--exp-dir", str(tmp_path / "none"), "--data-jsonl", str(data16k)]) == 2
    with pytest.raises(SystemExit) as usage:  # --strict judges the targets, which stage 5 does not
        bench_main(["--exp-dir", str(tmp_path / "none"), "--data-jsonl", str(data16k), "--strict"])
    assert usage.value.code == 2


def test_batched_fbank_equals_one_clip_at_a_time() -> None:
    """from_waves (one resampling and one fbank call for a batch) gives from_wave's values to float32
    rounding: any rate, stereo, and a clip under 25 ms (shortened window). Not bitwise: on some CPUs the
    batched matrix products take another SIMD path and differ by ~10 ulp (1e-5 on log-mels of ~12);
    a wrong window, resampling or padding differs by far more than 1e-4."""
    rng = np.random.default_rng(0)
    shapes = ((8000, 1, 8000), (3000, 2, 8000), (16000, 1, 16000), (300, 1, 16000), (22050, 1, 44100))
    waves = [(rng.standard_normal((n, c)).astype(np.float32) * 0.1, r) for n, c, r in shapes]
    ex = FbankExtractor(FbankConf())
    for got, wave in zip(ex.from_waves(waves), waves, strict=True):
        want = ex.from_wave(*wave)
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_am_mvn_round_trip(tmp_path: Path) -> None:
    mean, std = np.linspace(-3, 3, 560), np.linspace(0.5, 2, 560)
    write_am_mvn(tmp_path / "am.mvn", mean, std)
    shift, scale = read_am_mvn(tmp_path / "am.mvn")
    np.testing.assert_allclose(shift, -mean, rtol=1e-6)
    np.testing.assert_allclose(scale, 1 / std, rtol=1e-6)
    (tmp_path / "bad.mvn").write_text("<Nnet>\n</Nnet>\n")
    with pytest.raises(ValueError, match="AddShift"):
        read_am_mvn(tmp_path / "bad.mvn")
