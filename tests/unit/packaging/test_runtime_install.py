"""The package's runtime installed as a deployment installs it (issue #32, item 5): a fresh venv with
runtime/requirements.txt alone, wheels from the package index, on a CPU. It must stay under 600 MB,
hold no torch, CUDA, funasr or librosa, and give the texts the recipe's own environment gives, from the
command line and over HTTP.

One venv for the module (a minute from the index, seconds from pip's cache); its size is printed, and
docs/serving.md quotes it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
import soundfile as sf

from funasr_recipe.data.tags import strip_tags
from funasr_recipe.packaging.package import runtime_files, runtime_requirements
from funasr_recipe.runtime.onnx_asr import OnnxASR
from tests.helpers.packaged import package_env, package_server
from tests.unit.packaging.test_package_deploy import heavy

MAX_INSTALL_MB = 600

pytestmark = pytest.mark.slow  # builds a venv from the package index


def venv_mb(venv: Path) -> float:
    """Disk used by every file under ``venv`` (as ``du`` counts it), in MiB."""
    return sum(p.lstat().st_blocks * 512 for p in venv.rglob("*") if not p.is_symlink()) / 2**20


@pytest.fixture(scope="module")
def lean_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The python of a new venv holding the runtime's requirements, and nothing of the recipe's venv."""
    root = tmp_path_factory.mktemp("lean")
    (root / "requirements.txt").write_text("\n".join(runtime_requirements(runtime_files())) + "\n")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--only-binary", ":all:"]
    res = subprocess.run([*pip, "-r", str(root / "requirements.txt")], capture_output=True, text=True,
                         timeout=1200)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    return str(venv / "bin" / "python")


def test_the_runtime_installs_on_a_cpu_under_600_mb(lean_python: str) -> None:
    venv = Path(lean_python).parents[1]
    size = venv_mb(venv)
    print(f"runtime venv: {size:.0f} MiB")
    assert size < MAX_INSTALL_MB
    listed = subprocess.run([lean_python, "-m", "pip", "list", "--format", "json"], capture_output=True,
                            text=True, check=True, timeout=120).stdout
    assert heavy([d["name"] for d in json.loads(listed)]) == []
    res = subprocess.run([lean_python, "-c", "import torch"], capture_output=True, text=True, timeout=60)
    assert res.returncode != 0 and "No module named 'torch'" in res.stderr


def test_the_package_transcribes_in_it_as_in_the_recipe(exp: tuple[str, Path], data16k: Path,
                                                         lean_python: str, tmp_path: Path) -> None:
    """Clips at 16 kHz, an 8 kHz recording, and 44.1 kHz stereo: the resampler and downmix run too."""
    _, exp_dir = exp
    pkg = exp_dir / "package"
    expected = (pkg / "runtime" / "requirements.txt").read_text().splitlines()
    assert [ln for ln in expected if not ln.startswith("#")] == runtime_requirements(runtime_files())
    sources = [json.loads(ln)["source"] for ln in data16k.read_text().splitlines()]
    wave, rate = sf.read(sources[0], dtype="float32")
    at44 = np.interp(np.arange(0, len(wave), rate / 44100), np.arange(len(wave)), wave)
    sf.write(tmp_path / "stereo.wav", np.stack([at44, 0.5 * at44], axis=1), 44100)
    sf.write(tmp_path / "8k.wav", wave[::2], 8000)
    files = [*sources[:4], str(tmp_path / "stereo.wav"), str(tmp_path / "8k.wav")]
    command = ["-m", "funasr_recipe.runtime.transcribe", "onnx", *files, "--threads", "1",
               "--batch-size", "2"]
    lean, recipe = (subprocess.run([python, *command], cwd=pkg, env=package_env(pkg), capture_output=True,
                                   text=True, timeout=300) for python in (lean_python, sys.executable))
    assert lean.returncode == 0, lean.stderr[-3000:]
    assert lean.stdout == recipe.stdout and len(lean.stdout.splitlines()) == len(files)


def test_the_package_serves_from_it(exp: tuple[str, Path], data16k: Path, lean_python: str) -> None:
    """The OpenAI route, as a client calls it, from the lean venv."""
    _, exp_dir = exp
    pkg = exp_dir / "package"
    source = json.loads(data16k.read_text().splitlines()[0])["source"]
    with package_server(pkg, lean_python) as url:
        name = httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]
        got = httpx.post(f"{url}/v1/audio/transcriptions", files={"file": Path(source).read_bytes()},
                         data={"model": name, "response_format": "json"}, timeout=60)
    assert got.status_code == 200, got.text
    assert got.json()["text"] == strip_tags(OnnxASR(pkg / "onnx", threads=1)([source])[0])
