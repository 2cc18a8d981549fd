"""Stage 5's Triton repositories that take audio (packaging/triton_ensemble.py), on tiny random-init models
of each family exported and packaged by the stage programs (tests/helpers/model_dirs.py).

No tritonserver here (tests/helpers/triton_fake.py plays its part): every config.pbtxt is parsed with Triton's
own schema; each ensemble is checked by the rules tritonserver applies when it loads one (every mapped
name exists, every required input is fed once, types equal and dims agree up to -1, each step's max
batch covers the ensemble's, every output is produced), and the check is shown to catch planted breaks;
each ensemble is run as Triton runs it: its steps in turn over a list of requests, the python models'
own ``execute`` with Triton's request/response objects stubbed, the encoder through onnxruntime, every
tensor checked against its config. The texts must be the recipe's runtime's (OnnxASR) on the same files
in the same batches: random weights emit garbage, the same garbage by both paths.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from funasr_recipe.core.imports import imported_modules, module_file
from funasr_recipe.data.tags import split_tags
from funasr_recipe.families.registry import SENSEVOICE
from funasr_recipe.features.audio import load_audio
from funasr_recipe.packaging.package import runtime_files
from funasr_recipe.packaging.triton_ensemble import PYTHON_MODEL, TAGS
from funasr_recipe.runtime.onnx_asr import OnnxASR
from local.export import main as export_main
from local.package import main as package_main
from tests.helpers.model_dirs import FAMILIES, UNGATED_INT8, build_model_dir
from tests.helpers.triton_fake import (  # skips this module where tritonclient is missing
    FakeRequest,
    FakeTensor,
    Server,
    ensemble_problems,
    model_config_pb2,
    read_configs,
    type_name,
)

ROOT = Path(__file__).resolve().parents[3]

REPOS = ("triton", "triton_gpu")


# -- fixtures ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module", params=list(FAMILIES))
def package(request: pytest.FixtureRequest, data16k: Path,
            tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """(family, exp/<tag>/package) of a random-init model exported (stage 4) and packaged (stage 5)."""
    family = request.param
    root = tmp_path_factory.mktemp(family)
    exp_dir = root / f"tiny_{family.lower()}"
    shutil.copytree(build_model_dir(root, family, data16k), exp_dir / "final")
    assert export_main(["--model-dir", str(exp_dir / "final"), "--out", str(exp_dir / "export"),
                        "--data-jsonl", str(data16k), "--threads", "2", *UNGATED_INT8]) == 0
    assert package_main(["--exp-dir", str(exp_dir), "--data-jsonl", str(data16k)]) == 0
    return family, exp_dir / "package"


def audio_requests(data_jsonl: Path, batch: int, prompt: dict[str, int] | None = None) -> tuple[list, list]:
    """(file paths, ensemble requests of ``batch`` clips each: WAV zero-padded, WAV_LENS)."""
    sources = [json.loads(line)["source"] for line in data_jsonl.read_text().splitlines()]
    requests = []
    for start in range(0, len(sources), batch):
        waves = [load_audio(s)[0][:, 0] for s in sources[start:start + batch]]  # 16 kHz mono: the model's
        wav = np.zeros((len(waves), max(len(w) for w in waves)), dtype=np.float32)
        for i, w in enumerate(waves):
            wav[i, : len(w)] = w
        request = {"WAV": wav, "WAV_LENS": np.array([[len(w)] for w in waves], dtype=np.int32)}
        request |= {k: np.full((len(waves), 1), v, dtype=np.int32) for k, v in (prompt or {}).items()}
        requests.append(request)
    return sources, requests


def texts(outputs: list[dict[str, np.ndarray]], name: str = "TEXT") -> list[str]:
    return [row[0].decode("utf-8") for out in outputs for row in out[name]]


# -- tests ---------------------------------------------------------------------------------------------
def names(pkg: Path, family: str) -> dict[str, set[str]]:
    tag = pkg.parent.name
    decoder = "paraformer_decoder" if family == "Paraformer" else "ctc_decoder"
    return {"triton": {tag, f"{tag}_int8", "feature_extractor", decoder, f"{tag}_asr", f"{tag}_asr_int8"},
            "triton_gpu": {f"{tag}_fp16", "feature_extractor_fp16", f"{decoder}_fp16", f"{tag}_asr_fp16"}}


def test_configs_parse_and_only_the_gpu_repository_needs_a_gpu(package: tuple[str, Path]) -> None:
    family, pkg = package
    kind_name = model_config_pb2.ModelInstanceGroup.Kind.Name
    for repo, expected in names(pkg, family).items():
        configs = read_configs(pkg / repo)
        assert set(configs) == expected == {p.name for p in (pkg / repo).iterdir()}
        for name, config in configs.items():
            assert config.name == name
            kinds = [kind_name(g.kind) for g in config.instance_group]
            if config.platform == "ensemble":
                assert (pkg / repo / name / "1").is_dir() and not kinds
            elif config.backend == "python":
                assert (pkg / repo / name / "1" / "model.py").read_bytes() == PYTHON_MODEL.read_bytes()
                assert kinds == ["KIND_CPU"]
            else:
                assert config.backend == "onnxruntime" and (pkg / repo / name / "1" / "model.onnx").is_file()
            # A KIND_GPU model fails to load without a GPU, and tritonserver then exits.
            assert ("KIND_GPU" in kinds) == (repo == "triton_gpu" and config.backend == "onnxruntime")
    assert not set.intersection(*names(pkg, family).values())  # one server can load both repositories
    tag = pkg.parent.name
    asr = read_configs(pkg / "triton")[f"{tag}_asr"]
    shown = {t.name: (type_name(t), list(t.dims), t.optional) for t in asr.input}
    shown |= {t.name: (type_name(t), list(t.dims), False) for t in asr.output}  # outputs: never optional
    prompt = {"LANGUAGE": ("TYPE_INT32", [1], True), "TEXTNORM": ("TYPE_INT32", [1], True)}
    tags = {t: ("TYPE_STRING", [1], False) for t in TAGS}
    assert shown == {"WAV": ("TYPE_FP32", [-1], False), "WAV_LENS": ("TYPE_INT32", [1], False),
                     "TEXT": ("TYPE_STRING", [1], False),
                     **(prompt | tags if family == "SenseVoiceSmall" else {})}


def test_ensembles_hold_together_and_the_check_sees_breaks(package: tuple[str, Path]) -> None:
    family, pkg = package
    for repo in REPOS:
        configs = read_configs(pkg / repo)
        for name in (n for n, c in configs.items() if c.platform == "ensemble"):
            assert ensemble_problems(configs, name) == [], name
    tag = pkg.parent.name
    name, encoder = f"{tag}_asr", tag
    decoder = next(iter(names(pkg, family)["triton"] - {tag, f"{tag}_int8", "feature_extractor", name,
                                                        f"{tag}_asr_int8"}))

    def broken(model: str, edit: object) -> list[str]:
        configs = read_configs(pkg / "triton")
        edit(configs[model])
        return ensemble_problems(configs, name)

    def rename_mapped_input(c: object) -> None:
        step = c.ensemble_scheduling.step[1]
        step.input_map["speeech"] = step.input_map.pop("speech")

    def retype_wav(c: object) -> None:
        c.input[0].data_type = model_config_pb2.TYPE_FP16

    def narrow_speech(c: object) -> None:
        next(t for t in c.output if t.name == "speech").dims[1] += 1

    def lose_text(c: object) -> None:
        c.ensemble_scheduling.step[2].output_map["text"] = "TEXTS"

    def small_batch(c: object) -> None:
        c.max_batch_size = 8

    assert any("non-existing input speeech" in p for p in broken(name, rename_mapped_input))
    assert any("input speech is not mapped" in p for p in broken(name, rename_mapped_input))
    assert any("WAV is TYPE_FP32 here, TYPE_FP16 elsewhere" in p for p in broken(name, retype_wav))
    assert any("SPEECH has dims" in p for p in broken("feature_extractor", narrow_speech))
    assert any("output TEXT is produced by no step" in p for p in broken(name, lose_text))
    assert any("max batch 8" in p for p in broken(decoder, small_batch))
    assert any("max batch 8" in p for p in broken(encoder, small_batch))
    if family == "SenseVoiceSmall":
        def require_language(c: object) -> None:
            next(t for t in c.input if t.name == "language").optional = False

        assert broken("feature_extractor", require_language) == [
            f"{name} -> feature_extractor: optional LANGUAGE feeds required input language"]


@pytest.mark.parametrize("int8", [False, True], ids=["fp32", "int8"])
def test_ensemble_gives_the_runtimes_texts(package: tuple[str, Path], data16k: Path,
                                           monkeypatch: pytest.MonkeyPatch, int8: bool) -> None:
    """Two requests of 4 clips each, both in every step's one ``execute`` call (as the dynamic batcher
    hands them over), against OnnxASR in batches of 4 from the same files."""
    family, pkg = package
    server = Server(pkg / "triton", monkeypatch)
    sources, requests = audio_requests(data16k, 4)
    out = server.infer(f"{pkg.parent.name}_asr{'_int8' if int8 else ''}", requests)
    runtime = OnnxASR(pkg / "onnx", quantize=int8, threads=2, batch_size=4)
    expected = runtime(sources)
    assert texts(out) == expected and any(expected)
    # The features themselves are the runtime's, bit for bit.
    fe = server.infer("feature_extractor", [{"wav": r["WAV"], "wav_lens": r["WAV_LENS"]} for r in requests])
    mine = [s[:n] for out_ in fe for s, n in zip(out_["speech"], out_["speech_lengths"][:, 0], strict=True)]
    assert all(np.array_equal(a, b) for a, b in zip(mine, runtime.features(sources), strict=True))
    if family == "SenseVoiceSmall":
        for name in TAGS:
            kind = name.removesuffix("_TAG").lower()
            for text, value in zip(expected, texts(out, name), strict=True):
                assert value == split_tags(text)[0].get(kind, "")


def test_sensevoice_prompt_is_optional_per_request(package: tuple[str, Path], data16k: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """LANGUAGE/TEXTNORM where a request has them, the runtime's defaults (auto, woitn) where it has not,
    in the same call."""
    family, pkg = package
    if family != "SenseVoiceSmall":
        pytest.skip("only SenseVoiceSmall takes a prompt")
    prompt = {"LANGUAGE": SENSEVOICE.language_ids["en"], "TEXTNORM": SENSEVOICE.textnorm_ids["withitn"]}
    sources, asked = audio_requests(data16k, 4, prompt)
    _, plain = audio_requests(data16k, 4)
    out = Server(pkg / "triton", monkeypatch).infer(f"{pkg.parent.name}_asr", [asked[0], plain[1]])
    en = OnnxASR(pkg / "onnx", threads=2, batch_size=4, language="en", textnorm="withitn")(sources[:4])
    auto = OnnxASR(pkg / "onnx", threads=2, batch_size=4)(sources)
    assert en != auto[:4], "the prompt should change a random model's output, or this test tells nothing"
    assert texts(out) == en + auto[4:]


def test_gpu_repository_passes_fp16_between_the_steps(package: tuple[str, Path], data16k: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """triton_gpu/ on onnxruntime's CPU provider (the TensorRT one is asked for by config, not here): the
    ensemble runs, its features are the runtime's rounded to float16, and the fp16 scores decode."""
    _, pkg = package
    server = Server(pkg / "triton_gpu", monkeypatch)
    sources, requests = audio_requests(data16k, 4)
    out = server.infer(f"{pkg.parent.name}_asr_fp16", requests)  # check_tensor: fp16 where configured
    assert len(texts(out)) == len(sources)
    fe = server.infer("feature_extractor_fp16", [{"wav": requests[0]["WAV"],
                                                  "wav_lens": requests[0]["WAV_LENS"]}])
    runtime = OnnxASR(pkg / "onnx", threads=2).features(sources[:4])
    for s, n, f in zip(fe[0]["speech"], fe[0]["speech_lengths"][:, 0], runtime, strict=True):
        assert s.dtype == np.float16 and np.array_equal(s[:n], f.astype(np.float16))


def test_a_bad_request_fails_alone(package: tuple[str, Path], data16k: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    _, pkg = package
    server = Server(pkg / "triton", monkeypatch)
    model = server._load("feature_extractor")
    _, (request, *_) = audio_requests(data16k, 2)
    good = FakeRequest([FakeTensor("wav", request["WAV"]), FakeTensor("wav_lens", request["WAV_LENS"])])
    too_long = request["WAV_LENS"] + request["WAV"].shape[1]
    bad = FakeRequest([FakeTensor("wav", request["WAV"]), FakeTensor("wav_lens", too_long)])
    first, second = model.execute([bad, good])
    assert first.has_error() and "at most the row's samples" in first.error().message()
    assert not second.has_error() and len(second.output_tensors()) >= 2


def test_runtime_ships_what_the_python_models_import(package: tuple[str, Path]) -> None:
    """Every module of the recipe that model.py imports, and every one those import, is in runtime/, where
    each python model's runtime_dir points."""
    _, pkg = package
    runtime = pkg / "runtime"
    shipped = sorted(runtime.rglob("*.py"))
    modules = {str(f) for f in runtime_files() if f.suffix == ".py"}  # the web page's files are not modules
    assert {str(p.relative_to(runtime)) for p in shipped} == modules
    for path in [PYTHON_MODEL, *shipped]:
        for module in imported_modules(path):
            if module.startswith("funasr_recipe.") and module_file(ROOT, module):
                assert module_file(runtime, module), f"{path.name} imports {module}, not in runtime/"
    for repo in REPOS:
        for name, config in read_configs(pkg / repo).items():
            if config.backend == "python":
                rel = config.parameters["runtime_dir"].string_value
                assert (pkg / repo / name / rel).resolve() == runtime.resolve()


def test_card_states_the_client_side_shapes(package: tuple[str, Path]) -> None:
    family, pkg = package
    card = (pkg / "README.md").read_text()
    section = card.split("With Triton:", 1)[1].split("With TensorRT:", 1)[0]
    assert "tritonserver --model-repository triton --model-repository triton_gpu" in section
    asr = read_configs(pkg / "triton")[f"{pkg.parent.name}_asr"]
    for t in [*asr.input, *asr.output]:
        shape = f"[-1, {', '.join(map(str, t.dims))}]"
        assert f"| {t.name} | " in section and f"| {type_name(t)} | {shape} |" in section
    for repo in REPOS:
        for name, config in read_configs(pkg / repo).items():
            if config.platform == "ensemble":
                assert f"`{name}` (" in section and f"in {repo}/)" in section
            elif config.backend == "onnxruntime":  # the encoders' own shapes, batch first
                listed = section.split(f"`{repo}/{name}/config.pbtxt`", 1)[1].split("\n", 1)[0]
                for t in [*config.input, *config.output]:
                    dims = ", ".join(map(str, t.dims))
                    assert f"{t.name} {type_name(t)} [-1, {dims}]" in listed
