"""A model dir the config cannot fine-tune is refused before any stage: a from-scratch config reads no
--pretrained-dir, and a config of one model class cannot fine-tune a model of another."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from funasr_recipe.core.rejections import BadInputError
from funasr_recipe.model.pretrained import check_fits

REPO = Path(__file__).resolve().parents[3]
SMALL = REPO / "conf" / "sensevoice_small.yaml"


def _model_dir(path: Path, model: str) -> Path:
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(f"model: {model}\nencoder: X\n")
    (path / "model.pt").write_bytes(b"")
    return path


def test_the_model_class_must_be_the_configs(tmp_path: Path) -> None:
    same = _model_dir(tmp_path / "sv", "SenseVoiceSmall")
    check_fits(SMALL, "iic/SenseVoiceSmall", "SenseVoiceSmall", same, same)
    other = _model_dir(tmp_path / "pf", "Paraformer")
    with pytest.raises(BadInputError, match=r"pf holds a Paraformer model and .*sensevoice_small.yaml "
                                            r"fine-tunes SenseVoiceSmall: use paraformer.yaml"):
        check_fits(SMALL, "iic/SenseVoiceSmall", "SenseVoiceSmall", other, other)
    check_fits(SMALL, "iic/SenseVoiceSmall", "SenseVoiceSmall", None, None)  # not downloaded yet: stage 2's


def test_a_from_scratch_config_refuses_a_model_dir(tmp_path: Path) -> None:
    with pytest.raises(BadInputError, match="trains from scratch .* nothing reads --pretrained-dir"):
        check_fits(REPO / "conf" / "tiny_sensevoice.yaml", None, "SenseVoiceSmall", tmp_path)
    check_fits(REPO / "conf" / "tiny_sensevoice.yaml", None, "SenseVoiceSmall", None)


@pytest.mark.parametrize("program", ["local.check_config", "local.resolve_model"])
def test_both_programs_exit_2_naming_the_problem(tmp_path: Path, program: str) -> None:
    """check_config runs before stage 0, resolve_model where stages 1-3 resolve the model dir."""
    other = _model_dir(tmp_path / "pf", "Paraformer")
    for config, expected in ((SMALL, "holds a Paraformer model"), (REPO / "conf" / "tiny_sensevoice.yaml",
                                                                     "trains from scratch")):
        res = subprocess.run([sys.executable, "-m", program, "--config", str(config), "--pretrained-dir",
                              str(other)], cwd=REPO, capture_output=True, text=True, timeout=120)
        assert res.returncode == 2 and expected in res.stderr, res.stderr[-2000:]
