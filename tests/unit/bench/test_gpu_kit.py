"""The GPU kit (bench/gpu/): its scripts parse and pass shellcheck, the wheel list is pinned by
constraints.txt, the random-weight model dir has the released SenseVoiceSmall's architecture and size and
the hub's layout, the figures come out right from a real training run's log and decode dir, and the
import check names what is missing. The whole pipeline runs on CPU here (check.sh --cpu, marked slow), on
the GPU where there is one (marked gpu), and from the wheel set under python3.12 when GPU_KIT_PYTHON names
one (a throwaway venv with torch 2.11 and the device's packages: bench/gpu/README.md).

  .venv/bin/python -m pytest tests/unit/bench/test_gpu_kit.py -q
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from bench.gpu import imports as import_check
from bench.gpu.random_model_dir import (
    RELEASED,
    TINY,
    architecture,
    build_model,
    count_parameters,
    write_model_dir,
)
from bench.gpu.report import H200_BF16_DENSE_TFLOPS, decode_figures, model_facts, table, train_figures
from funasr_recipe.model.model_dir import is_model_dir, load_automodel
from funasr_recipe.model.tokenizer import SENSEVOICE_TAG_IDS, SENSEVOICE_VOCAB_SIZE, model_file_name
from tests.helpers.run_sh import CLEAN_ENV

ROOT = Path(__file__).resolve().parents[3]
SCRIPTS = (ROOT / "bench/gpu/prepare.sh", ROOT / "bench/gpu/check.sh")
TRAINED_WORLD_SIZE = 2  # the ``trained`` fixture's run.sh ran 2 CPU ranks


def script(*args: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**CLEAN_ENV, **(env or {})})


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_scripts_parse_and_pass_shellcheck(path: Path) -> None:
    assert script("-n", str(path)).returncode == 0
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed")
    res = subprocess.run(["shellcheck", "-x", str(path.relative_to(ROOT))], cwd=ROOT, capture_output=True,
                         text=True)
    assert res.returncode == 0, res.stdout


def test_wheel_list_is_pinned_by_the_constraints() -> None:
    """Every wheel's version is constraints.txt's (torchaudio's is the device torch's), funasr and
    deepspeed among them; nothing the device already has (torch) travels."""
    res = script(str(SCRIPTS[0]), "--list")
    assert res.returncode == 0, res.stderr
    specs = res.stdout.split()
    pins = {line.split("==")[0].lower().replace("_", "-"): line.strip()
            for line in (ROOT / "constraints.txt").read_text().splitlines() if "==" in line}
    for spec in specs:
        name = spec.split("==")[0].lower().replace("_", "-")
        if name == "torchaudio":
            assert spec == "torchaudio==2.11.0"
        else:
            assert pins[name] == spec
    names = {s.split("==")[0].lower() for s in specs}
    assert {"funasr", "deepspeed", "hydra-core", "kaldiio", "soundfile"} <= names
    assert not names & {"torch", "numpy", "onnxruntime"}


def test_sizes_fit_what_travels() -> None:
    """prepare.sh --sizes adds the wheels there are (none in a fresh clone) to the tree and stays under
    the device tool's 64 MiB."""
    res = script(str(SCRIPTS[0]), "--sizes")
    assert res.returncode == 0, res.stderr
    assert "of the 64 MiB that travel" in res.stdout and "corpora/" in res.stdout


def test_released_architecture_is_the_recorded_one() -> None:
    """The kit's model dir is the released config.yaml (funasr_recipe/model/released.py) but for the
    tokenizer class, which the recipe's sensevoice tokenizer needs."""
    ours = OmegaConf.to_container(architecture("released"))
    recorded = OmegaConf.to_container(OmegaConf.load(RELEASED))
    assert ours.pop("tokenizer") == "SenseVoiceTagTokenizer"
    assert recorded.pop("tokenizer") == "SentencepiecesTokenizer"
    assert ours.pop("tokenizer_conf") == {"bpemodel": None, "unk_symbol": "<unk>", "split_with_space": True}
    assert ours == recorded
    tiny = OmegaConf.to_container(architecture("tiny"))
    assert tiny.pop("encoder_conf") == OmegaConf.to_container(OmegaConf.load(TINY).encoder_conf)
    assert {k: v for k, v in tiny.items() if not k.startswith("tokenizer")} == {
        k: v for k, v in ours.items() if k != "encoder_conf"}


def test_real_size_has_the_released_parameter_count() -> None:
    """234 M parameters, as the released SenseVoiceSmall (on the meta device: no weights allocated)."""
    released = count_parameters(build_model(architecture("released"), "meta"))
    assert 233.5e6 < released < 234.5e6
    tiny = architecture("tiny")
    assert tiny.encoder_conf == OmegaConf.load(TINY).encoder_conf
    assert count_parameters(build_model(tiny, "meta")) < released / 20


def test_model_dir_is_a_hub_format_sensevoice(prepared: Path, tmp_path: Path) -> None:
    """The tiny size through the same code path as the real one: a dir funasr loads like a downloaded
    model, with the released tokenizer layout, the parameter count it records, and a rerun that skips."""
    jsonl = prepared / "data" / "train" / "data.jsonl"
    out = tmp_path / "model"
    params = write_model_dir(jsonl, out, "tiny", cmvn_utterances=20)
    assert is_model_dir(out)
    names = {p.name for p in out.iterdir()}
    assert {"model.pt", "config.yaml", "configuration.json", "am.mvn", "tokens.json",
            model_file_name("sensevoice")} <= names
    assert model_facts(out) == (params, 6, 10.0)
    cfg = OmegaConf.load(out / "config.yaml")
    assert cfg.encoder_conf == architecture("tiny").encoder_conf
    assert cfg.tokenizer == "SenseVoiceTagTokenizer"
    tokens = json.loads((out / "tokens.json").read_text())
    assert len(tokens) == SENSEVOICE_VOCAB_SIZE and tokens[SENSEVOICE_TAG_IDS["<|en|>"]] == "<|en|>"
    model = load_automodel(out, threads=1)
    assert count_parameters(model.model) == params
    stamp = (out / "model.pt").stat().st_mtime_ns
    assert write_model_dir(jsonl, out, "tiny", cmvn_utterances=20) == params
    assert (out / "model.pt").stat().st_mtime_ns == stamp


def _metric_lines(log: Path) -> list[dict]:
    """Rank 0's train_metrics objects, read without the report's parser."""
    return [json.loads(line.split("train_metrics: ", 1)[1]) for line in log.read_text().splitlines()
            if "[node0 rank0]" in line and "train_metrics: " in line]


def test_train_figures_from_a_real_training_log(trained: Path) -> None:
    log = trained / "train.log"
    lines = _metric_lines(log)
    assert len(lines) > 3
    params = 234_000_000
    f = train_figures(log, params, TRAINED_WORLD_SIZE)
    steady, world = lines[1:], TRAINED_WORLD_SIZE
    frames = statistics.median(x["frames_per_s"] for x in steady) * world
    assert f["intervals"] == len(steady) and f["last_step"] == lines[-1]["step"]
    assert f["utt_per_s"] == pytest.approx(statistics.median(x["utt_per_s"] for x in steady) * world)
    assert f["audio_s_per_s"] == pytest.approx(frames / 100)
    flop_per_s = 6 * params * frames / 6  # forward and backward, per LFR frame (6 fbank frames)
    assert f["model_flop_utilisation"] == pytest.approx(flop_per_s / (H200_BF16_DENSE_TFLOPS * 1e12))
    assert f["data_wait"] == pytest.approx(statistics.median(x["data_wait"] for x in steady))
    assert f["peak_gpu_gib"] == 0.0 and f["peak_reserved_gib"] == 0.0  # funasr's lines were read: 0 on CPU
    rows = table({"deepspeed": f}, None, params, H200_BF16_DENSE_TFLOPS).splitlines()
    assert rows[-1].split()[0] == "deepspeed" and "989 TFLOP/s" in rows[0]
    with pytest.raises(ValueError, match="train_metrics lines"):
        train_figures(log, params, skip=len(lines))


def test_decode_figures_agree_with_the_merge(trained: Path) -> None:
    """The RTF from the shards' stats equals the one stage 3's merge wrote into decode.json."""
    merged = sorted(p for p in trained.glob("decode_*/decode.json") if "pretrained" not in p.parent.name)
    assert merged, f"no decode dir in {trained}"
    summary = json.loads(merged[0].read_text())
    f = decode_figures(merged[0].parent, summary["processes"])
    assert f["audio_seconds"] == pytest.approx(summary["audio_seconds"], abs=1e-3)
    assert f["rtf"] == pytest.approx(summary["rtf"], rel=1e-2) and f["device"] == "cpu"


def test_import_check_names_an_unregistered_class(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """Here everything imports; with SenseVoiceSmall gone from funasr's registry the check says so."""
    assert import_check.check(None) == []
    out = capsys.readouterr().out
    assert "funasr" in out and "this machine" in out
    from funasr.register import tables

    monkeypatch.delitem(tables.model_classes, "SenseVoiceSmall")
    missing = import_check.check(None)
    assert len(missing) == 1 and "SenseVoiceSmall" in missing[0]


def _check_sh(tmp: Path, *args: str, env: dict | None = None, timeout: float = 1500) -> dict:
    """check.sh with the test's own Python and packages (no wheel install); returns summary.json."""
    venv_ext = Path(sys.executable).resolve().parents[1] / "torch_extensions"  # path.sh's JIT build dir
    res = script(str(SCRIPTS[1]), *args, timeout=timeout,
                 env={"PYTHON": sys.executable, "CHECK_INSTALL": "false", "CHECK_DIR": str(tmp / "check"),
                      "TORCH_EXTENSIONS_DIR": str(venv_ext), **(env or {})})
    assert res.returncode == 0, res.stderr[-4000:]
    return json.loads((tmp / "check" / "summary.json").read_text())


def _assert_figures(summary: dict) -> None:
    assert set(summary["train"]) == {"deepspeed", "ddp"}
    for f in summary["train"].values():
        assert f["intervals"] >= 1 and f["utt_per_s"] > 0 and f["audio_s_per_s"] > 0
        assert 0 < f["model_flop_utilisation"] < 1 and 0 <= f["data_wait"] <= 1
    assert math.isfinite(summary["decode"]["rtf"]) and summary["decode"]["rtf"] > 0


@pytest.mark.slow
def test_check_sh_runs_on_cpu(tmp_path: Path) -> None:
    """The whole pipeline, CPU-sized: stage 0, a tiny random model dir, stage 1, both engines, decoding."""
    summary = _check_sh(tmp_path, "--cpu")
    _assert_figures(summary)
    assert summary["decode"]["device"] == "cpu" and summary["parameters"] < 10e6


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_check_sh_on_the_gpu(tmp_path: Path) -> None:
    summary = _check_sh(tmp_path, timeout=900)
    _assert_figures(summary)
    assert summary["parameters"] > 233e6 and summary["decode"]["device"] == "cuda"
    assert all(f["peak_gpu_gib"] > 0 for f in summary["train"].values())


@pytest.mark.skipif(not os.environ.get("GPU_KIT_PYTHON"),
                    reason="GPU_KIT_PYTHON (a python3.12 with torch 2.11 and the device's packages) unset")
def test_wheel_set_installs_and_imports_under_python312(tmp_path: Path) -> None:
    """The wheels (downloaded first with GPU_KIT_DOWNLOAD=1) install with --no-index into a fresh dir, and
    funasr, deepspeed and the stage programs import from it beside that Python's own packages."""
    wheels = ROOT / "bench/gpu/wheels"
    if os.environ.get("GPU_KIT_DOWNLOAD") == "1":
        res = script(str(SCRIPTS[0]), timeout=1800)
        assert res.returncode == 0, res.stderr[-3000:]
    if not list(wheels.glob("*.whl")):
        pytest.skip(f"no wheels in {wheels}: run bench/gpu/prepare.sh (or set GPU_KIT_DOWNLOAD=1)")
    py, site = os.environ["GPU_KIT_PYTHON"], tmp_path / "site"
    subprocess.run([py, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", str(site),
                    *map(str, wheels.glob("*.whl"))], check=True, timeout=600)
    res = subprocess.run([py, "-m", "bench.gpu.imports", "--site", str(site)], cwd=ROOT, capture_output=True,
                         text=True, timeout=600, env={**CLEAN_ENV, "PYTHONPATH": f"{site}:{ROOT}"})
    assert res.returncode == 0, res.stderr[-3000:]
    origins = {line.split()[0]: line.split()[-2:] for line in res.stdout.splitlines() if line[:1].isalpha()}
    assert origins["funasr"] == ["wheel", "set"] and origins["deepspeed"] == ["wheel", "set"]
    assert origins["torch"] == ["this", "machine"]
