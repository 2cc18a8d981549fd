"""Faults of the training nodes: run.sh stopped by a signal while it trains, and a whole node's process
group killed with SIGKILL in a two-node run (two run.sh processes over 127.0.0.1)."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest

from funasr_recipe.compat.preemption import EXIT_PREEMPTED
from tests.faults.procs import log_has, processes_with, start_run_sh, wait_for
from tests.helpers.run_sh import run_sh
from tests.helpers.train_fixtures import FAST, free_port

pytestmark = pytest.mark.fault_slow
EPOCHS = ["++train_conf.max_epoch=3", *FAST]


def stage2(prepared: Path, exp: str, port: int, *more: str) -> list[str]:
    return ["--stage", "2", "--stop-stage", "2", "--data-dir", str(prepared / "data"), "--dump-dir",
            str(prepared / "dump"), "--exp-dir", str(prepared / exp), "--master-port", str(port), *more]


def epoch_1_started(exp: Path) -> bool:
    """Epoch 0's checkpoint is written and epoch 1 has logged a step: there is something to resume from."""
    return (exp / "model.pt.ep1").exists() and log_has(exp / "train.log", r"epoch: 1/\d+, .*total step")


def steps(log: Path) -> list[int]:
    return [int(s) for s in re.findall(r"train, rank: 0, .*?total step: (\d+)", log.read_text())]


@pytest.mark.fault("SIGTERM to run.sh (only its own pid) in the middle of an epoch, then a rerun")
def test_sigterm_mid_epoch_saves_the_step_and_a_rerun_continues_there(prepared: Path, lost) -> None:
    exp = prepared / "exp_sigterm"
    port = free_port()
    # A timed checkpoint every 3 s as well: each supersedes the last, the SIGTERM's supersedes them all.
    args = stage2(prepared, "exp_sigterm", port, "--", *EPOCHS, "++train_conf.checkpoint_minutes=0.05")
    run = start_run_sh(*args, stderr=prepared / "sigterm.err")
    # A few steps into epoch 1: its checkpoint alone would lose them.
    wait_for(lambda: epoch_1_started(exp) and len(steps(exp / "train.log")) >= 7, "epoch 1's steps", run,
             timeout=600)
    signalled = time.monotonic()
    os.kill(run.pid, signal.SIGTERM)
    assert run.wait(timeout=120) == EXIT_PREEMPTED, (prepared / "sigterm.err").read_text()[-3000:]
    took = time.monotonic() - signalled
    err = (prepared / "sigterm.err").read_text()
    saved = json.loads((exp / "preempted.json").read_text())
    assert f"checkpoint {saved['checkpoint']} saved" in err
    assert saved["epoch"] >= 1 and saved["step_in_epoch"] > 0
    assert (exp / saved["checkpoint"]).exists() and not (exp / ".train.done").exists()
    assert re.search(r"timed checkpoint model\.pt\.ep\d+\.\d+ \(every 0\.05 min\)", err), err[-3000:]
    assert sorted(p.name for p in exp.glob("model.pt.ep*.*")) == [saved["checkpoint"]]
    wait_for(lambda: not processes_with("local.train", str(exp)), "the ranks to stop", timeout=30)
    before = steps(exp / "train.log")
    res = run_sh(*args, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    after = steps(exp / "train.log")[len(before):]
    # funasr logs the total step of every 2nd update (log_interval 2, counted from the resumed batch): the
    # rerun starts with the update after the checkpoint's, repeating none.
    assert saved["total_step"] < after[0] <= saved["total_step"] + 2, (saved, before[-3:], after[:3])
    assert f"epoch {saved['epoch']} resumes after {saved['step_in_epoch']} batches" in res.stderr
    assert max(before) - saved["total_step"] <= 1, (saved, before[-3:])
    assert not (exp / saved["checkpoint"]).exists()  # superseded by the epoch's own checkpoint
    unsaved = max(0, max(before) - saved["total_step"])
    lost(f"{unsaved} steps: the checkpoint of step {saved['total_step']} was saved "
         f"{saved['seconds_to_save']:.1f} s after the signal, run.sh exited {EXIT_PREEMPTED} "
         f"{took:.1f} s after it, and the rerun continued with the next batch of epoch {saved['epoch']}")


@pytest.mark.fault("kill -9 of node 1's whole process group in a 2-node training, then a rerun")
def test_a_killed_node_takes_its_ranks_down_and_the_survivor_names_it(prepared: Path, lost) -> None:
    exp = prepared / "exp_lost_node"
    port = free_port()
    nodes = ["--nnodes", "2", "--nproc-per-node", "1", "--master-addr", "127.0.0.1"]
    runs = [start_run_sh(*stage2(prepared, "exp_lost_node", port, *nodes, "--node-rank", str(n), "--",
                                 *EPOCHS), stderr=prepared / f"lost_node{n}.err") for n in (0, 1)]
    wait_for(lambda: epoch_1_started(exp), "epoch 1 to start", runs[0], timeout=600)
    assert processes_with("local.train", str(exp), env_has="NODE_RANK=1"), "node 1 has no rank training"
    killed = time.monotonic()
    os.killpg(runs[1].pid, signal.SIGKILL)
    runs[1].wait()
    # torchrun started node 1's rank in a session of its own: only dying with its parent stops it.
    wait_for(lambda: not processes_with("local.train", str(exp), env_has="NODE_RANK=1"),
             "node 1's rank to die with its node", timeout=30)
    assert runs[0].wait(timeout=300) == 1
    took = time.monotonic() - killed
    err = (prepared / "lost_node0.err").read_text()
    assert re.search(r"node 1 \(\S+\) was lost: its heartbeat", err), err[-3000:]
    assert not (exp / ".train.done").exists()
    wait_for(lambda: not processes_with("local.train", str(exp)), "node 0's rank to stop", timeout=60)
    reruns = [start_run_sh(*stage2(prepared, "exp_lost_node", port, *nodes, "--node-rank", str(n), "--",
                                   *EPOCHS), stderr=prepared / f"lost_rerun{n}.err") for n in (0, 1)]
    assert [r.wait(timeout=900) for r in reruns] == [0, 0], (prepared / "lost_rerun0.err").read_text()[-3000:]
    assert (exp / ".train.done").exists()
    lost(f"the steps since epoch 1's checkpoint; node 0 stopped {took:.0f} s after the kill naming node 1 as "
         "lost, and the rerun on both nodes resumed and finished")
