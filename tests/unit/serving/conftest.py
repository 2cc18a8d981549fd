"""The served model of the HTTP service's fast tests (tests/helpers/serve_app.py)."""

from __future__ import annotations

import pytest

from funasr_recipe.runtime.onnx_asr import OnnxASR
from tests.helpers.serve_app import peaked_export


@pytest.fixture(scope="package")
def asr(tmp_path_factory: pytest.TempPathFactory) -> OnnxASR:
    return OnnxASR(peaked_export(tmp_path_factory.mktemp("peaked")), threads=1)
