"""A malformed or truncated am.mvn is bad input naming the file, the line and what is wrong
(features/cmvn.read_am_mvn), not numpy's "inhomogeneous shape" from funasr's reader; run.sh's first check
(local/check_config.py --cmvn) reports it, and a dimension the config's frontend does not give.

Reads conf/tiny_sensevoice.yaml; writes am.mvn files under tmp.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from funasr_recipe.core.rejections import BadInputError
from funasr_recipe.features.cmvn import read_am_mvn, write_am_mvn
from local.check_config import main

ROOT = Path(__file__).resolve().parents[3]
DIM = 560  # 80 mel bins x 7 stacked frames: conf/tiny_sensevoice.yaml's frontend


def good(path: Path, dim: int = DIM) -> list[str]:
    """A valid am.mvn of ``dim`` at ``path``, as its lines: 4 <AddShift>, 5 its values, 6 <Rescale>, 7 its."""
    write_am_mvn(path, np.linspace(-2, 2, dim), np.linspace(0.5, 1.5, dim))
    return path.read_text().splitlines()


def rejected(path: Path, lines: list[str]) -> str:
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(BadInputError) as e:
        read_am_mvn(path)
    return str(e.value)


def test_a_truncated_am_mvn_names_the_file_and_line(tmp_path: Path) -> None:
    path, lines = tmp_path / "am.mvn", good(tmp_path / "am.mvn")
    assert read_am_mvn(path)[0].shape == read_am_mvn(path)[1].shape == (DIM,)
    assert rejected(path, [*lines[:6], lines[6][:200]]) == \
        f"{path}:7: <Rescale>'s values do not end with ']' (a truncated file?)"
    assert rejected(path, lines[:6]) == \
        f"{path}:7: <Rescale> is not followed by '<LearnRateCoef> 0 [ values ]' (the file ends)"
    assert rejected(path, lines[:5]) == f"{path}: not an am.mvn: no <Rescale> section"


def shift_values(lines: list[str], *tokens: str) -> list[str]:
    """``lines`` with <AddShift>'s third value replaced by ``tokens`` (none: dropped)."""
    words = lines[4].split()
    return [*lines[:4], " ".join([*words[:5], *tokens, *words[6:]]), *lines[5:]]


def test_a_malformed_am_mvn_says_what_is_wrong(tmp_path: Path) -> None:
    path, lines = tmp_path / "am.lfr7x6.mvn", good(tmp_path / "am.lfr7x6.mvn")
    at = f"{path}:5: <AddShift>"
    assert rejected(path, shift_values(lines, "x")).startswith(f"{at}: a value is not a number (")
    assert rejected(path, shift_values(lines)) == f"{at} has {DIM - 1} values, its header {DIM}"
    assert rejected(path, shift_values(lines, "nan")) == f"{at} holds non-finite values (nan or inf)"
    other = good(tmp_path / "other.mvn", 80)
    assert rejected(path, [*lines[:5], *other[5:]]) == (
        f"{path}: <AddShift> has {DIM} values and <Rescale> 80: not one dimension "
        "(a truncated or mixed file?)")
    assert rejected(path, ["<Nnet>", "<AddShift> 3 3", "<Rescale> 3 3", "</Nnet>"]) == \
        f"{path}:3: <AddShift> is not followed by '<LearnRateCoef> 0 [ values ]' (truncated or malformed)"
    path.write_bytes(b"\x80\x81 binary")
    with pytest.raises(BadInputError, match=r"am.lfr7x6.mvn: not an am.mvn \(not text"):
        read_am_mvn(path)


def test_the_first_check_reports_every_bad_cmvn(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    config = ["--config", str(ROOT / "conf" / "tiny_sensevoice.yaml")]
    truncated = tmp_path / "train" / "am.lfr7x6.mvn"
    truncated.parent.mkdir()
    lines = good(truncated)
    truncated.write_text("\n".join([*lines[:6], lines[6][:100]]))
    narrow, other_lfr = tmp_path / "am.mvn", tmp_path / "am.lfr1x1.mvn"
    fine = tmp_path / "fine" / "am.lfr7x6.mvn"
    fine.parent.mkdir()
    for path, dim in ((narrow, 80), (other_lfr, 80), (fine, DIM)):
        good(path, dim)
    assert main([*config, "--cmvn", str(truncated), "--cmvn", str(narrow), "--cmvn", str(other_lfr),
                 "--cmvn", str(tmp_path / "missing.mvn"), "--"]) == 2
    assert [line.split("] ", 2)[-1] for line in capsys.readouterr().err.splitlines()] == [
        f"{truncated}:7: <Rescale>'s values do not end with ']' (a truncated file?)",
        f"{narrow}: 80 dimensions, but the config's frontend gives n_mels 80 x lfr_m 7 = 560",
        f"--cmvn {tmp_path / 'missing.mvn'}: no such file"]  # am.lfr1x1.mvn: another LFR setting's
    # The config's frontend after the overrides: 40 mel bins make a 280-dim am.mvn the right one.
    assert main([*config, "--cmvn", str(fine), "--cmvn", str(other_lfr)]) == 0
    good(narrow, 280)
    assert main([*config, "--cmvn", str(narrow), "--", "++frontend_conf.n_mels=40"]) == 0
