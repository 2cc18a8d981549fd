"""dist/markers.py and dist/checkin.py, and run.sh's side of them (local/marker.py): one marker system."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from funasr_recipe.dist.checkin import check_in
from funasr_recipe.dist.markers import (
    WaitTimeout,
    fingerprint,
    is_done,
    mark_done,
    marker_info,
    read_fingerprint,
    wait_for_marker,
    wait_for_shards,
)

ROOT = Path(__file__).resolve().parents[3]


def marker_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "local.marker", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)


def test_fingerprint_follows_parts_contents_and_files(tmp_path: Path) -> None:
    table = tmp_path / "text"
    table.write_text("a ONE\n")
    base = fingerprint("stage 0", "--nj 2", contents=[table])
    assert len(base) == 16 and base == fingerprint("stage 0", "--nj 2", contents=[table])
    assert base != fingerprint("stage 0", "--nj 3", contents=[table])
    assert base != fingerprint("stage 0 --nj 2", contents=[table])  # parts are not run together
    table.write_text("a TWO\n")  # the user edits a table in place
    assert base != fingerprint("stage 0", "--nj 2", contents=[table])
    # A missing table is a state of its own, not an error.
    assert fingerprint(contents=[tmp_path / "utt2lang"]) != fingerprint(contents=[])
    weights = tmp_path / "model.pt"
    weights.write_bytes(b"x" * 10)
    by_stat = fingerprint(files=[weights])
    os.utime(weights, ns=(1, 1))  # rewritten: another mtime, same bytes
    assert fingerprint(files=[weights]) != by_stat


def test_markers_are_whole_and_carry_a_summary(tmp_path: Path) -> None:
    done = tmp_path / "shards" / "00000.done"
    done.parent.mkdir()
    assert not is_done(done, "ab12") and read_fingerprint(done) is None
    mark_done(done, "ab12", {"accepted": 3})
    assert is_done(done, "ab12") and not is_done(done, "ab13")
    assert marker_info(done) == {"accepted": 3}
    mark_done(done, "cd34")
    assert read_fingerprint(done) == "cd34" and marker_info(done) == {}
    assert [p.name for p in done.parent.iterdir()] == ["00000.done"]  # no temporary left behind


def test_waiting_for_node0_names_a_stale_marker(tmp_path: Path) -> None:
    marker = tmp_path / ".done"
    mark_done(marker, "old")
    with pytest.raises(WaitTimeout, match=r"waited 0s for node 0 to finish stage 1 .*it holds old") as e:
        wait_for_marker(marker, "new", "stage 1", timeout=0.0, poll=0.01)
    assert "filesystem all nodes share" in str(e.value)
    threading.Timer(0.2, mark_done, (marker, "new")).start()
    wait_for_marker(marker, "new", "stage 1", timeout=10, poll=0.05)


def test_shards_wait_names_the_missing_ranks(tmp_path: Path) -> None:
    with pytest.raises(WaitTimeout, match=r"shard 1 \(rank 1\), shard 3 \(rank 1\)"):
        wait_for_shards(lambda i: i % 2 == 0, 4, 2, "dump/train", timeout=0.0, poll=0.01)


def test_check_in_names_the_nodes_that_did_not_arrive(tmp_path: Path) -> None:
    nodes = tmp_path / ".nodes"
    with pytest.raises(WaitTimeout, match=r"node\(s\) 1 2 of 3 have not arrived .*--node-rank 1 2"):
        check_in(nodes, "fp", node_rank=0, nnodes=3, timeout=0.0, poll=0.01)
    (nodes / "node1").write_text("other-run host\n")  # an older run's check-in does not count
    (nodes / "node2").write_text("fp host\n")
    with pytest.raises(WaitTimeout, match=r"node\(s\) 1 of 3"):
        check_in(nodes, "fp", node_rank=0, nnodes=3, timeout=0.0, poll=0.01)
    threading.Timer(0.2, lambda: (nodes / "node1").write_text("fp host\n")).start()
    start = time.monotonic()
    check_in(nodes, "fp", node_rank=0, nnodes=3, timeout=10, poll=0.05)
    assert time.monotonic() - start < 5


def test_run_sh_side_is_the_same_system(tmp_path: Path) -> None:
    table = tmp_path / "wav.scp"
    table.write_text("a /a.wav\n")
    done = tmp_path / ".done"
    res = marker_cli("fingerprint", "--contents", str(table), "--", "stage 0", "--nj 2")
    assert res.returncode == 0 and res.stdout.strip() == fingerprint("stage 0", "--nj 2", contents=[table])
    fp = res.stdout.strip()
    assert marker_cli("check", str(done), fp).returncode == 1  # not done: false, as test(1)
    assert marker_cli("write", str(done), fp).returncode == 0 and is_done(done, fp)
    assert marker_cli("check", str(done), fp).returncode == 0
    # A later stage's fingerprint is made from the marker of the one before.
    res = marker_cli("fingerprint", "--markers", str(done), "--", "stage 1")
    assert res.stdout.strip() == fingerprint(fp, "stage 1")
    res = marker_cli("fingerprint", "--markers", str(tmp_path / "missing.done"), "--", "stage 1")
    assert res.returncode == 2 and "missing.done missing: run the stage that writes it first" in res.stderr
    res = marker_cli("wait", str(tmp_path / "never.done"), fp, "--what", "stage 3", "--timeout", "0")
    assert res.returncode == 1 and "waited 0s for node 0 to finish stage 3" in res.stderr
