"""Faults of the processes and the filesystem on one node: Ctrl-C in stage 0, kill -9 in stage 1, a full
filesystem in stage 1, a umask of 000 and a world-writable shared dir."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from funasr_recipe.data.line_index import SUFFIX, LineIndex
from tests.faults.procs import start_run_sh, wait_for
from tests.helpers.run_sh import run_sh
from tests.helpers.train_data import make_digit_subset


def digit_args(root: Path, *more: str) -> list[str]:
    return ["--corpus", "kaldi", "--corpus-dir", str(root / "kaldi"), "--data-dir", str(root / "data"),
            "--dump-dir", str(root / "dump"), "--exp-dir", str(root / "exp"), "--nj", "2", *more]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Stages 0-1 of a small digit corpus, uninterrupted: what every interrupted run must equal."""
    root = tmp_path_factory.mktemp("reference")
    make_digit_subset(root / "kaldi", per_digit_train=3, per_digit_dev=1)
    res = run_sh("--stage", "0", "--stop-stage", "1", *digit_args(root, "--shard-size", "20"), timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return root


@contextlib.contextmanager
def small_filesystem(path: Path, size: str) -> Iterator[None]:
    """A tmpfs of ``size`` mounted at ``path`` for the block (skips the test where mounting is refused)."""
    path.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {mounted.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run(["umount", str(path)], check=True)


def same_index(a: Path, b: Path) -> bool:
    """Two line indexes (data/line_index.py) hold the same numbers, and b's describes its jsonl: their
    offsets differ with the length of the absolute paths in the lines."""
    ia, ib = (LineIndex(p.with_suffix(""), p) for p in (a, b))
    return ib.stale() is None and all(np.array_equal(getattr(ia, k), getattr(ib, k))
                                      for k in ("source_len", "target_len", "flags"))


def same_outputs(a: Path, b: Path, sub: str) -> list[str]:
    """Files under a/sub and b/sub that differ (paths of a in b's files are written as b's)."""
    differ = []
    for fa in sorted((a / sub).rglob("*")):
        rel = fa.relative_to(a)
        fb = b / rel
        if fa.is_dir() or fa.name.endswith((".done", ".log", "report.json")) or "log" in rel.parts:
            continue
        if not fb.is_file():
            differ.append(f"{rel} missing")
            continue
        if fa.name.endswith(SUFFIX):
            if not same_index(fa, fb):
                differ.append(str(rel))
            continue
        da, db = fa.read_bytes(), fb.read_bytes()
        if da.replace(str(a).encode(), str(b).encode()) != db:
            differ.append(str(rel))
    return differ


@pytest.mark.fault("Ctrl-C (SIGINT to the process group) in stage 0, then a rerun")
def test_ctrl_c_in_stage_0_then_rerun_gives_the_same_data(reference: Path, tmp_path: Path, lost) -> None:
    shutil.copytree(reference / "kaldi", tmp_path / "kaldi")
    run = start_run_sh("--stage", "0", "--stop-stage", "0", *digit_args(tmp_path), stderr=tmp_path / "err")
    wait_for(lambda: (tmp_path / "data" / "log").is_dir(), "stage 0 to start", run, timeout=120, poll=0.05)
    os.killpg(run.pid, signal.SIGINT)
    assert run.wait(timeout=60) != 0
    assert not (tmp_path / "data" / ".done").exists()
    res = run_sh("--stage", "0", "--stop-stage", "0", *digit_args(tmp_path))
    assert res.returncode == 0, res.stderr[-3000:]
    assert same_outputs(reference, tmp_path, "data") == []


@pytest.mark.fault("kill -9 of the process group in the middle of stage 1, then a rerun")
def test_kill_9_in_stage_1_then_rerun_is_byte_identical(reference: Path, tmp_path: Path, lost) -> None:
    shutil.copytree(reference / "kaldi", tmp_path / "kaldi")
    res = run_sh("--stage", "0", "--stop-stage", "0", *digit_args(tmp_path))
    assert res.returncode == 0, res.stderr[-3000:]
    run = start_run_sh("--stage", "1", "--stop-stage", "1", *digit_args(tmp_path, "--shard-size", "20"),
                       stderr=tmp_path / "err")
    shards = tmp_path / "dump" / "train" / "shards"
    wait_for(lambda: shards.is_dir() and len(list(shards.glob("*.done"))) >= 2, "two finished shards", run)
    os.killpg(run.pid, signal.SIGKILL)
    run.wait(timeout=60)
    done_before = len(list(shards.glob("*.done")))
    assert not (tmp_path / "dump" / ".done").exists()
    res = run_sh("--stage", "1", "--stop-stage", "1", *digit_args(tmp_path, "--shard-size", "20"))
    assert res.returncode == 0, res.stderr[-3000:]
    todo = [re.search(r"train: rank \d+ of \d+: (\d+) of its (\d+) shards to compute", f.read_text())
            for f in sorted((tmp_path / "dump" / "log").glob("fbank.*.log"))]
    assert sum(int(m.group(1)) for m in todo) == sum(int(m.group(2)) for m in todo) - done_before
    assert same_outputs(reference, tmp_path, "dump") == []
    lost(f"the unfinished shards only: {done_before} finished shards were kept; the rerun's dump/ is "
         "byte-identical to an uninterrupted run's")


@pytest.mark.fault("filesystem full during stage 1, then a rerun once there is room")
def test_full_filesystem_in_stage_1_leaves_no_done_and_a_rerun_completes(reference: Path, tmp_path: Path,
                                                                         lost) -> None:
    shutil.copytree(reference / "kaldi", tmp_path / "kaldi")
    assert run_sh("--stage", "0", "--stop-stage", "0", *digit_args(tmp_path)).returncode == 0
    dump = tmp_path / "dump"
    with small_filesystem(dump, "400k"):
        res = run_sh("--stage", "1", "--stop-stage", "1", *digit_args(tmp_path, "--shard-size", "20"))
        assert res.returncode != 0
        assert "No space left on device" in res.stderr
        assert not (dump / ".done").exists()
        assert not list(dump.glob("*/.done"))
    res = run_sh("--stage", "1", "--stop-stage", "1", *digit_args(tmp_path, "--shard-size", "20"))
    assert res.returncode == 0, res.stderr[-3000:]
    assert same_outputs(reference, tmp_path, "dump") == []


@pytest.mark.fault("umask 000, and a shared exp dir made world-writable (chmod 777)")
def test_outputs_are_not_world_writable_at_umask_000_and_a_777_dir_is_warned(tmp_path: Path, lost) -> None:
    make_digit_subset(tmp_path / "kaldi", per_digit_train=1, per_digit_dev=1)
    (tmp_path / "exp").mkdir()
    (tmp_path / "exp").chmod(0o777)
    run = start_run_sh("--stage", "0", "--stop-stage", "0", *digit_args(tmp_path), stderr=tmp_path / "err",
                       umask="000")
    assert run.wait(timeout=300) == 0, (tmp_path / "err").read_text()[-3000:]
    assert f"WARNING: {tmp_path / 'exp'} is writable by every user" in (tmp_path / "err").read_text()
    modes = {p: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "data").rglob("*")}
    bad = {str(p): oct(m) for p, m in modes.items() if m & 0o022}
    assert not bad, bad
    assert modes[tmp_path / "data" / "train" / "data.jsonl"] == 0o644
    assert modes[tmp_path / "data" / "train"] == 0o755


@pytest.mark.fault_slow
@pytest.mark.fault("filesystem of the exp dir full during training")
def test_full_filesystem_in_stage_2_is_named_on_the_terminal(reference: Path, tmp_path: Path, lost) -> None:
    exp = tmp_path / "exp"
    with small_filesystem(exp, "1m"):
        res = run_sh("--stage", "2", "--stop-stage", "2", "--data-dir", str(reference / "data"), "--dump-dir",
                     str(reference / "dump"), "--exp-dir", str(exp), "--nproc-per-node", "1", "--",
                     "++train_conf.max_epoch=1", timeout=600)
    assert res.returncode != 0
    tail = res.stderr.splitlines()[-3:]
    assert any(f"no space left on {exp} ({exp}:" in line for line in tail), "\n".join(tail)
    lost("the run (it cannot save); the terminal names the full file system, not a log that could not be "
         "written")
