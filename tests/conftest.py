"""Fixtures shared across test files, and the test tiers.

Tiers, run in this order by one ``pytest``:
  fast   tests/unit/repo/ (ruff, shellcheck, layering, import cycles) first, then the rest of tests/unit/
         (by sub-package of the library, plus recipes and benches), which train nothing and start no
         run.sh: ``pytest -m "not slow"`` runs just this tier;
  slow   every test in tests/e2e/ or tests/faults/, every test marked ``slow``, and every test that uses a
         fixture in SLOW_FIXTURES (a run.sh or training run behind it): marked ``slow`` here, automatically.
The slow tier runs after the fast one, and not at all once a fast test has failed (a broken unit fails
the run in minutes, not after the end-to-end runs); ``--all-tiers`` runs it regardless.

A fast test that starts run.sh, torchrun or the stage-2 program fails naming itself: mark it slow (or
move it to tests/e2e/), so that the fast tier keeps its promise.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.helpers.data16k import data16k  # noqa: F401  (module fixture: 8 digit clips at 16 kHz)
from tests.helpers.model_dirs import data_jsonl  # noqa: F401  (module fixture: 20 bundled digit clips)
from tests.helpers.stage1_data import corpus, dumped  # noqa: F401  (session fixtures: real sets and their stage 1)
from tests.helpers.train_fixtures import finetuned, prepared, trained  # noqa: F401  (session: stages 0-2 runs)
from tests.helpers.zero_runs import zero_runs  # noqa: F401  (session: a training run per DeepSpeed config)

HERE = Path(__file__).parent
SLOW_DIRS = (HERE / "e2e", HERE / "faults")
# Session fixtures that run run.sh (stages 0-1, a training, a fine-tune) or serve its trained model.
SLOW_FIXTURES = frozenset({"prepared", "trained", "finetuned", "serving", "served", "zero_runs"})
# What a fast test may not start: the recipe's stages and training.
HEAVY_COMMANDS = ("run.sh", "torchrun", "local.train", "torch.distributed.run")
_FAST_FAILED: list[str] = []


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--all-tiers", action="store_true",
                     help="run the slow tier even after a fast test failed")


def _is_slow(item: pytest.Item) -> bool:
    path = Path(str(item.path))
    return (item.get_closest_marker("slow") is not None
            or any(path.is_relative_to(d) for d in SLOW_DIRS)
            or bool(SLOW_FIXTURES & set(getattr(item, "fixturenames", ()))))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the slow tier and put it after the fast one, the repo's checks first (a stable sort: files
    keep their order within each)."""
    for item in items:
        if _is_slow(item) and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.slow)
    # The repository's own checks (ruff, layering, cycles) first: the cheapest to fail.
    items.sort(key=lambda item: (item.get_closest_marker("slow") is not None,
                                 not Path(str(item.path)).is_relative_to(HERE / "unit" / "repo")))


def pytest_runtest_setup(item: pytest.Item) -> None:
    if _FAST_FAILED and item.get_closest_marker("slow") and not item.config.getoption("--all-tiers"):
        pytest.skip(f"the fast tier failed ({', '.join(_FAST_FAILED[:3])}): slow tier not run "
                    "(--all-tiers runs it anyway)")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.failed and "slow" not in report.keywords:
        _FAST_FAILED.append(report.nodeid)


def _heavy(words: list[str]) -> str | None:
    """What of HEAVY_COMMANDS a command line runs (``bash -n run.sh`` only parses it, ``run.sh --help``
    only prints), else None."""
    names = [Path(w).name for w in words]
    if names[-1:] == ["--help"] and "run.sh" in names and "-m" not in names:
        return None
    if names and names[0] in ("run.sh", "torchrun"):
        return names[0]
    if names and names[0] in ("bash", "sh") and "-n" not in names and "run.sh" in names:
        return "run.sh"
    module = words[words.index("-m") + 1] if "-m" in words[:-1] else None
    if module in HEAVY_COMMANDS:
        return module
    return None


@pytest.fixture(autouse=True)
def _fast_tests_start_no_runs(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """In the fast tier, starting run.sh, torchrun or the trainer is an error that names the test."""
    if request.node.get_closest_marker("slow"):
        return
    original = subprocess.Popen.__init__

    def guarded(self: subprocess.Popen, args, *a, **kw) -> None:  # type: ignore[no-untyped-def]
        words = str(args).split() if isinstance(args, (str, bytes, Path)) else [str(x) for x in args]
        heavy = _heavy(words)
        if heavy:
            raise RuntimeError(f"{request.node.nodeid} is in the fast tier but starts {heavy}: mark it "
                               "@pytest.mark.slow or move it to tests/e2e/ (tests/conftest.py)")
        original(self, args, *a, **kw)

    monkeypatch.setattr(subprocess.Popen, "__init__", guarded)
