"""Node heartbeats and outcomes (funasr_recipe/dist/node_status.py), the failure explanation built on them
(dist/train_failure.py), and workers that die with their parent (core/lifetime.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from funasr_recipe.dist import node_status
from funasr_recipe.dist.train_failure import explain

FP = "f00dfeedf00dfeed"


@pytest.fixture
def fast_beats(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(node_status, "BEAT_S", 0.05)
    monkeypatch.setattr(node_status, "LOST_AFTER_S", 0.5)


def beat_in_thread(nodes: Path, node: int, beats: int | None, stop: threading.Event) -> threading.Thread:
    """A heartbeat of ``node`` that stops after ``beats`` beats (None: when ``stop`` is set)."""
    def run() -> None:
        n = 0
        while not stop.is_set() and (beats is None or n < beats):
            node_status.heartbeat(nodes, FP, node, os.getpid(), beats=1)
            n += 1

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_beating_peer_is_running_a_silent_one_lost_and_an_outcome_settles(tmp_path: Path,
                                                                            fast_beats) -> None:
    stop = threading.Event()
    beat_in_thread(tmp_path, 1, None, stop)          # alive all along
    beat_in_thread(tmp_path, 2, 2, stop).join()      # two beats, then nothing: lost
    node_status.set_outcome(tmp_path, FP, 3, ok=False)
    time.sleep(0.2)
    states = {s.node: s.state for s in node_status.peer_states(tmp_path, FP, 5, 0, watch_s=2.0)}
    stop.set()
    assert states == {1: "running", 2: "lost", 3: "failed", 4: "absent"}


def test_beats_of_another_run_do_not_count(tmp_path: Path, fast_beats) -> None:
    node_status.heartbeat(tmp_path, "0000000000000000", 1, os.getpid(), beats=1)
    node_status.set_outcome(tmp_path, "0000000000000000", 1, ok=True)
    [state] = node_status.peer_states(tmp_path, FP, 2, 0, watch_s=0.5)
    assert state.state == "absent"


def test_wait_for_peers_fails_on_a_lost_peer_and_passes_when_all_are_ok(tmp_path: Path, fast_beats) -> None:
    stop = threading.Event()
    beat_in_thread(tmp_path, 1, 2, stop).join()
    with pytest.raises(node_status.NodesFailed, match=r"node 1 \(.*\) was lost: its heartbeat"):
        node_status.wait_for_peers(tmp_path, FP, 0, 2, timeout=5)
    node_status.set_outcome(tmp_path, FP, 1, ok=True)
    node_status.wait_for_peers(tmp_path, FP, 0, 2, timeout=5)


def test_explain_names_the_lost_node_for_a_peer_reset(tmp_path: Path, fast_beats) -> None:
    stop = threading.Event()
    beat_in_thread(tmp_path, 1, 2, stop).join()
    log = tmp_path / "train.log"
    log.write_text("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Read error "
                   "[127.0.0.1]:29500: Connection reset by peer\n")
    lines = explain(tmp_path, FP, 2, 0, log, "127.0.0.1:29500", watch_s=2.0)
    assert len(lines) == 1 and lines[0].startswith("node 1 (") and "was lost" in lines[0]
    assert "rerun the same command on every node" in lines[0]


def test_heartbeat_stops_when_its_parent_is_gone(tmp_path: Path) -> None:
    parent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    beat = subprocess.Popen([sys.executable, "-m", "local.marker", "node", "heartbeat", str(tmp_path), FP,
                             "--node-rank", "1", "--parent", str(parent.pid)])
    deadline = time.monotonic() + 30
    while not (tmp_path / "alive.node1").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert (tmp_path / "alive.node1").read_text().split()[0] == FP
    parent.kill()
    parent.wait()
    assert beat.wait(timeout=10) == 0


def test_a_worker_dies_with_its_parent_even_on_kill_9(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    child_py = tmp_path / "child.py"
    child_py.write_text("import os, sys, time\n"
                        "from funasr_recipe.core.lifetime import die_with_parent\n"
                        "die_with_parent()\n"
                        "open(sys.argv[1], 'w').write(str(os.getpid()))\n"
                        "time.sleep(60)\n")
    # The parent starts the child in a session of its own, as torchrun does, then waits.
    parent_code = ("import subprocess, sys, time\n"
                   f"subprocess.Popen([sys.executable, {str(child_py)!r}, {str(pid_file)!r}], "
                   "start_new_session=True)\n"
                   "time.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, "-c", parent_code], cwd=Path(__file__).parents[3],
                              env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[3])})
    deadline = time.monotonic() + 30
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline, "the child never started"
        time.sleep(0.1)
    child = int(pid_file.read_text())
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while _running(child):
        assert time.monotonic() < deadline, f"worker {child} outlived its parent's kill -9"
        time.sleep(0.1)


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False
