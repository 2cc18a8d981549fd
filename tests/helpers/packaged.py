"""Packages of tiny random-init models, and their HTTP service started from the package alone.

``exp``: a module fixture, one per family, of exp/<tag> holding final/ and a passed export/, then
packaged by stage 5 (SenseVoice benchmarked first, so that its card carries the table). Writes under
pytest's tmp; reads the data16k clips.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from local.bench_runtime import main as bench_main
from local.export import main as export_main
from local.package import main as package_main
from tests.helpers.model_dirs import FAMILIES, UNGATED_INT8, build_model_dir
from tests.helpers.train_fixtures import free_port


@pytest.fixture(scope="module", params=list(FAMILIES))
def exp(request: pytest.FixtureRequest, data16k: Path,
        tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """(family, exp/<tag>) with final/, export/ and package/."""
    family = request.param
    root = tmp_path_factory.mktemp(family)
    model_dir = build_model_dir(root, family, data16k)
    exp_dir = root / f"tiny_{family.lower()}"
    shutil.copytree(model_dir, exp_dir / "final")
    shutil.copyfile(root / "exp" / "config.yaml", exp_dir / "config.yaml")
    (exp_dir / "RESULTS.md").write_text("# RESULTS: tiny\n\n| model | set | WER % |\n|---|---|---:|\n"
                                        "| avg | dev | 99 |\n")
    assert export_main(["--model-dir", str(exp_dir / "final"), "--out", str(exp_dir / "export"),
                        "--data-jsonl", str(data16k), "--threads", "2", *UNGATED_INT8]) == 0
    if family == "SenseVoiceSmall":
        assert bench_main(["--exp-dir", str(exp_dir), "--data-jsonl", str(data16k), "--batch-sizes", "1,4",
                           "--threads", "2", "--cpu-only"]) == 0
    assert package_main(["--exp-dir", str(exp_dir), "--data-jsonl", str(data16k)]) == 0
    return family, exp_dir


def package_env(pkg: Path) -> dict[str, str]:
    """The environment the package's card runs its runtime in: runtime/ on the path, not the recipe."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(pkg / "runtime")}


@contextmanager
def package_server(pkg: Path, python: str) -> Iterator[str]:
    """The package's HTTP service started with ``python`` from pkg/ as the card says; yields its URL once
    /health answers, and stops it after."""
    port = free_port()
    proc = subprocess.Popen([python, "-m", "funasr_recipe.serving.cli", "--model-dir", "onnx",
                             "--port", str(port), "--threads", "1"], cwd=pkg, env=package_env(pkg),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(240):
            assert proc.poll() is None, proc.stderr.read()[-2000:]
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.25)
        yield url
    finally:
        proc.terminate()
        proc.wait(30)
