"""core/cli.py's one exit-code convention, core/imports.py's import graph, core/fmt.py."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from funasr_recipe.core.cli import DEBUG_ENV, EXIT_BAD_INPUT, EXIT_FAILURE, StageFailed, run_main
from funasr_recipe.core.fmt import pct
from funasr_recipe.core.imports import imported_modules, local_closure, third_party
from funasr_recipe.core.rejections import BadInputError, Rejection

ROOT = Path(__file__).resolve().parents[3]


def _raise(error: Exception):
    def work() -> None:
        raise error
    return work


@pytest.mark.parametrize(("error", "code"), [
    (FileNotFoundError("data/train/wav.scp is missing"), EXIT_BAD_INPUT),
    (BadInputError("--speed-perturb '3': factors must lie in [0.5, 2]"), EXIT_BAD_INPUT),
    (Rejection("data/train/wav.scp", 2, "spk1_b", "missing_file", "no such file").fatal(), EXIT_BAD_INPUT),
    (StageFailed("parity broken"), EXIT_FAILURE),
    (TimeoutError("node 1 never arrived"), EXIT_FAILURE),
])
def test_exit_codes(error: Exception, code: int, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR):
        assert run_main(_raise(error)) == code
    assert caplog.records[-1].getMessage() == str(error)  # one line, the message, no traceback
    assert caplog.records[-1].filename == "test_cli.py"  # logged where run_main was called from


def test_work_gives_its_own_code_and_bugs_keep_their_traceback() -> None:
    assert run_main(lambda: None) == 0 and run_main(lambda: 1) == 1
    with pytest.raises(KeyError):
        run_main(_raise(KeyError("a bug")))
    # A bare ValueError or NotImplementedError is no longer taken for the user's fault.
    for bug in (ValueError("bare"), NotImplementedError("bare"), TypeError("bare")):
        with pytest.raises(type(bug)):
            run_main(_raise(bug))
    assert "strict mode: data/train/wav.scp:2: spk1_b: missing_file: x" == str(
        Rejection("data/train/wav.scp", 2, "spk1_b", "missing_file", "x").fatal())


def _numpy_bug() -> None:
    import numpy as np

    np.zeros(3).reshape(2, 2)  # ValueError: cannot reshape array of size 3 into shape (2,2)


PROGRAM = """
import logging, sys
from funasr_recipe.core.cli import run_main
from funasr_recipe.core.rejections import BadInputError
from tests.unit.core.test_cli import _numpy_bug

def bad_input():
    raise BadInputError("data/train/text:3: empty transcript")

logging.basicConfig(format="%(levelname)s %(message)s")
sys.exit(run_main({"bug": _numpy_bug, "bad": bad_input}[sys.argv[1]]))
"""


def _run_program(which: str, debug: bool = False) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != DEBUG_ENV} | ({DEBUG_ENV: "1"} if debug else {})
    return subprocess.run([sys.executable, "-c", PROGRAM, which], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


def test_a_value_error_from_deep_inside_is_a_bug_with_its_traceback() -> None:
    """numpy's ValueError is not the user's input: Python's exit 1 and the whole traceback, not exit 2."""
    res = _run_program("bug")
    assert res.returncode == 1, res.stderr
    assert "Traceback (most recent call last)" in res.stderr and "_numpy_bug" in res.stderr
    assert "ValueError: cannot reshape array" in res.stderr


def test_bad_input_is_exit_2_with_one_line_and_its_traceback_with_recipe_debug() -> None:
    res = _run_program("bad")
    assert res.returncode == EXIT_BAD_INPUT
    assert res.stderr.splitlines() == ["ERROR data/train/text:3: empty transcript"]
    res = _run_program("bad", debug=True)
    assert res.returncode == EXIT_BAD_INPUT
    assert res.stderr.splitlines()[:2] == ["ERROR data/train/text:3: empty transcript",
                                           "Traceback (most recent call last):"]
    assert "BadInputError: data/train/text:3: empty transcript" in res.stderr


def test_package_validation_errors_are_bad_input() -> None:
    from funasr_recipe.data.kaldi_table import TableError
    from funasr_recipe.features.audio import AudioError
    from funasr_recipe.model.checkpoint import CorruptCheckpointError, UnsafeCheckpointError
    from funasr_recipe.scoring.score import ScoreInputError

    for cls in (TableError, ScoreInputError, UnsafeCheckpointError, CorruptCheckpointError):
        assert run_main(_raise(cls("x: broken"))) == EXIT_BAD_INPUT
    assert run_main(_raise(AudioError("missing_file", "no such file: a.wav"))) == EXIT_BAD_INPUT
    assert issubclass(BadInputError, ValueError)  # pytest.raises(ValueError) still catches it

def test_import_graph_reads_lazy_imports(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "a.py").write_text("import numpy\nfrom pkg import b\n\ndef f():\n    import pkg.c\n")
    (tmp_path / "pkg" / "b.py").write_text("import json\n")
    (tmp_path / "pkg" / "c.py").write_text("from yaml import safe_load\n")
    (tmp_path / "pkg" / "unused.py").write_text("import torch\n")
    assert {"numpy", "pkg", "pkg.b", "pkg.c"} <= imported_modules(tmp_path / "pkg" / "a.py")
    files = local_closure(tmp_path, "pkg.a", "pkg")
    assert [f.name for f in files] == ["__init__.py", "a.py", "b.py", "c.py"]
    assert third_party(files, "pkg") == {"numpy", "yaml"}


def test_the_shipped_runtime_needs_no_training_code() -> None:
    files = {str(f.relative_to(ROOT)) for f in local_closure(ROOT, "funasr_recipe.runtime.transcribe",
                                                             "funasr_recipe")}
    assert "funasr_recipe/runtime/onnx_asr.py" in files and "funasr_recipe/features/numpy_fbank.py" in files
    assert "funasr_recipe/features/fbank.py" not in files  # torch's frontend: training's, not the runtime's
    assert not {f for f in files if f.startswith(("funasr_recipe/model/", "funasr_recipe/scoring/"))}
    assert not {"funasr", "torch", "torchaudio"} & third_party([ROOT / f for f in files], "funasr_recipe")


def test_pct() -> None:
    assert pct(0.0782) == "7.82%" and pct(0.0782, sign=False) == "7.82"
    assert pct(None) == "-" and pct(None, "inf") == "inf"


def test_corpus_info_prints_fields_and_names_what_is_wrong(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture) -> None:
    from funasr_recipe.data.corpus import CorpusInfo, write_corpus_info
    from local.corpus_info import main

    assert main(["--data-dir", str(tmp_path), "sets"]) == 2  # no corpus.json: stage 0 has not run
    assert "corpus.json is missing: run stage 0 first" in capsys.readouterr().err
    write_corpus_info(tmp_path, CorpusInfo("c", "/c", "train", "dev", ["dev", "test"], "en"))
    assert main(["--data-dir", str(tmp_path), "train_set", "test_sets", "language"]) == 0
    assert capsys.readouterr().out == "train\ndev test\nen\n"
    assert main(["--data-dir", str(tmp_path), "speakers"]) == 2
    assert "has no field 'speakers'" in capsys.readouterr().err
    for broken in ("", '{"corpus": "c"}'):  # empty, and a JSON object without the fields
        (tmp_path / "corpus.json").write_text(broken)
        assert main(["--data-dir", str(tmp_path), "sets"]) == 2
        assert f"{tmp_path / 'corpus.json'}: not a corpus.json that a recipe wrote" in capsys.readouterr().err


def test_every_program_says_its_exit_codes_in_help(capsys: pytest.CaptureFixture[str]) -> None:
    """Every program of local/ and bench/ builds its parser with program_parser (so its --help ends with
    the exit codes and RECIPE_DEBUG), and that help says them."""
    import ast

    built_by_hand = []
    for path in sorted([*(ROOT / "local").glob("*.py"), *(ROOT / "bench").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr == "ArgumentParser":
                built_by_hand.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert built_by_hand == []
    from local.score import main as score_main

    with pytest.raises(SystemExit):
        score_main(["--help"])
    assert "RECIPE_DEBUG=1 shows its traceback" in capsys.readouterr().out
