"""The fault suite: each test causes one fault for real on CPU (a signal, a full filesystem, a hostile
corpus, a diverging run) and records a row: the fault, whether the recipe survived it, and what was lost
(steps, files, utterances). The table is printed at the end of the session, and written to the file
named by $FAULT_TABLE when that is set (the README's table comes from there).

Every fault runs in the default suite, in its slow tier (tests/conftest.py); ``fault_slow`` marks the
ones that train or start several nodes (minutes), so that ``-m "not fault_slow"`` can leave them out.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

_ROWS: list[tuple[str, str, str]] = []


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "fault(name): a fault of the fault suite's table")
    config.addinivalue_line("markers", "fault_slow: a fault that trains or starts several nodes (minutes)")


@pytest.fixture
def lost(request: pytest.FixtureRequest):
    """``lost("...")`` says what the fault cost, for the table (nothing said: "nothing")."""
    request.node.fault_lost = "nothing"

    def say(text: str) -> None:
        request.node.fault_lost = text

    return say


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    marker = item.get_closest_marker("fault")
    if marker is None or report.when != "call" or report.skipped:
        return
    survived = "yes" if report.passed else "NO"
    crash = getattr(report.longrepr, "reprcrash", None)
    detail = (getattr(item, "fault_lost", "nothing") if report.passed
              else f"test failed: {crash.message if crash else report.longrepr}"[:200])
    _ROWS.append((marker.args[0], survived, detail))


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if not _ROWS:
        return
    lines = ["| fault | survived | what was lost |", "|---|---|---|"]
    lines += [f"| {f} | {s} | {d.replace('|', '/')} |" for f, s, d in _ROWS]
    terminalreporter.section("fault table")
    for line in lines:
        terminalreporter.write_line(line)
    if out := os.environ.get("FAULT_TABLE"):
        Path(out).write_text("\n".join(lines) + "\n", encoding="utf-8")
