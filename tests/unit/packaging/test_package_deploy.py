"""What a package deploys with (issue #32, item 5): runtime/requirements.txt pins every distribution
the runtime needs, not only the ones it imports, and the container and systemd examples hold up."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from funasr_recipe.core.rejections import BadInputError
from funasr_recipe.packaging.package import DEPLOY, DEPLOY_DIR, ROOT, runtime_files, runtime_requirements
from funasr_recipe.packaging.requirements import pinned, read_pins


def test_every_requirement_is_pinned_transitive_ones_too() -> None:
    lines = runtime_requirements(runtime_files())
    pins = read_pins(ROOT / "constraints.txt")
    names = {re.sub(r"[-_.]+", "-", line.split("==")[0].lower()) for line in lines}
    assert all("==" in line for line in lines)
    # fastapi's and uvicorn's own requirements, which the runtime never imports by name
    assert {"starlette", "pydantic", "pydantic-core", "anyio", "h11", "click"} <= names
    for line in lines:
        name, version = line.split("==")
        assert pins[re.sub(r"[-_.]+", "-", name.lower())][1] == version, line


def test_an_untested_distribution_is_an_error(tmp_path: Path) -> None:
    constraints = tmp_path / "constraints.txt"
    constraints.write_text("fastapi==0.165.0\n")  # none of what fastapi requires
    with pytest.raises(BadInputError, match="no tested version of .*starlette"):
        pinned(["fastapi"], constraints)


def test_the_container_file_copies_what_a_package_holds() -> None:
    text = (ROOT / DEPLOY_DIR / "Containerfile").read_text()
    copied = re.findall(r"^COPY (\S+) ", text, flags=re.MULTILINE)
    assert copied == ["runtime/requirements.txt", "runtime", "onnx"]
    assert "funasr_recipe.serving.cli" in text and "RECIPE_API_KEY_FILE" in text
    assert set(DEPLOY) == {p.name for p in (ROOT / DEPLOY_DIR).iterdir()}


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze on this machine")
def test_the_systemd_unit_verifies(tmp_path: Path) -> None:
    unit = (ROOT / DEPLOY_DIR / "asr.service").read_text()
    # Its paths made real here: what systemd checks beyond the syntax is that the command exists.
    unit = unit.replace("/opt/asr/venv/bin/python", sys.executable).replace("/opt/asr/package", str(tmp_path))
    (tmp_path / "asr.service").write_text(unit)
    res = subprocess.run(["systemd-analyze", "verify", str(tmp_path / "asr.service")], capture_output=True,
                         text=True, timeout=60)
    problems = [ln for ln in (res.stdout + res.stderr).splitlines()
                if ln.strip() and "asr.service" in ln and "User=" not in ln]
    assert res.returncode == 0 and not problems, res.stdout + res.stderr


# What a CPU service must not pull in: torch and its CUDA wheels (about 7 GB), funasr and funasr-onnx
# (librosa, numba, scikit-learn). None of them may be in runtime/requirements.txt, and no runtime module
# may import them, at its top or inside a function the service calls.
HEAVY = ("torch", "torchaudio", "triton", "funasr", "funasr-onnx", "librosa", "numba", "scikit-learn",
         "scipy", "modelscope", "deepspeed")


def heavy(names: list[str]) -> list[str]:
    """The names among ``names`` (distributions, any spelling) that a CPU runtime must not install."""
    norm = [re.sub(r"[-_.]+", "-", n.lower()) for n in names]
    return sorted(n for n in norm if n in HEAVY or n.startswith("nvidia-"))


def test_the_runtime_requires_no_torch_or_funasr() -> None:
    names = [line.split("==")[0] for line in runtime_requirements(runtime_files())]
    assert heavy(names) == [], names
    assert {"onnxruntime", "numpy", "soundfile", "soxr", "fastapi", "uvicorn"} <= set(names)


def test_every_runtime_module_imports_with_torch_and_funasr_absent() -> None:
    """Each module the package ships, imported where torch, torchaudio, funasr and funasr_onnx cannot
    be (``sys.modules[name] = None`` makes their import fail), and the service built on a real export
    would then still have to avoid them at call time: tests/unit/packaging/test_runtime_install.py runs
    it in a venv without them."""
    modules = [str(f.with_suffix("")).replace("/", ".") for f in runtime_files() if f.suffix == ".py"]
    modules = [m.removesuffix(".__init__") for m in modules]
    blocked = ["torch", "torchaudio", "funasr", "funasr_onnx", "librosa"]
    code = ("import sys\n" + "".join(f"sys.modules[{b!r}] = None\n" for b in blocked)
            + "".join(f"import {m}\n" for m in modules))
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
