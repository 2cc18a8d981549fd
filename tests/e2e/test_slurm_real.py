"""slurm/run.sbatch under a real Slurm 22.05: slurmctld and two slurmd (n1, n2) on this machine
(tests/helpers/slurm_cluster.py; skipped, with the reason, where Debian's packages cannot be had).

Two jobs, one cluster:
- a stand-in run.sh on two nodes under the script's own directives and a 2-minute limit: Slurm's
  --signal=B:TERM@120 reaches the batch shell, which stops run.sh alone (not its children) on every
  node; its exit 75 requeues the job, whose second attempt appends to the same log;
- the demo itself, stages 0-2, on two nodes from a copy of this checkout with an untracked logs/ (the
  job's own log) in it: the preflight passes, `scancel --batch --signal=TERM` mid-epoch makes run.sh's
  trap save a checkpoint and exit 75, the job is requeued, and the requeued run continues with the
  next batch and finishes.

Reads the checkout (copied); writes the cluster's files and the copy under pytest's tmp dir.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from funasr_recipe.compat.preemption import EXIT_PREEMPTED
from tests.helpers.slurm_cluster import SlurmCluster, cluster_or_skip

ROOT = Path(__file__).resolve().parents[2]
JOB_LOG = "logs/funasr-recipe.{job}.out"  # slurm/run.sbatch's --output, relative to the submit dir
# Stages 0-2 of the demo, short: no speed-perturbed copies (a third of stage 1 and of the steps), one
# epoch of about 16 steps per rank; a line every 2 steps to stop it by.
TRAIN = ["--stop-stage", "2", "--nproc-per-node", "1", "--speed-perturb", "1.0", "--",
         "++train_conf.max_epoch=1", "++train_conf.log_interval=2"]

# Attempt 1 "trains" until SIGTERM (a child of it records a SIGTERM of its own: there must be none,
# the stop is for run.sh alone), then exits 75 as run.sh does after a checkpoint, node 1 3 s after node 0
# (node 0's exit must not kill a node still saving); attempt 2 finishes.
STAND_IN_RUN_SH = r"""#!/usr/bin/env bash
node=${SLURM_NODEID}
echo "stand-in run.sh on node ${node}, restart ${SLURM_RESTART_COUNT:-0}" >&2
if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ]; then echo "node ${node}: resumed and finished" >&2; exit 0; fi
( trap 'echo "node ${node}" >> "$(dirname "$0")/child_got_sigterm"' TERM
  while :; do sleep 0.5 & wait $!; done ) &
child=$!
saving() {
  kill -9 ${child}
  trap 'echo "node ${node}" >> "$(dirname "$0")/signalled_while_saving"' TERM
  if [ "${node}" -ne 0 ]; then sleep 3 & wait $!; wait $! || true; fi
  echo "node ${node}: SIGTERM, checkpoint saved" >&2; exit 75
}
trap saving TERM
while :; do sleep 0.5 & wait $!; done
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    yield from cluster_or_skip(tmp_path_factory)


def submit(cluster: SlurmCluster, recipe: Path, *args: str, cpus: int = 1) -> int:
    """sbatch from the recipe root, as the README does; the job id."""
    (recipe / "logs").mkdir(exist_ok=True)
    # The directives' --nodes, --cpus-per-task and --gpus-per-node are a GPU cluster's: these nodes have
    # the cores of this machine each, and no GPU.
    return cluster.sbatch(["--nodes=2", f"--cpus-per-task={cpus}", "--gpus-per-node=0", *args], cwd=recipe)


def attempts(log: str) -> list[str]:
    """The job log's text per attempt (run.sbatch marks each one's start)."""
    return re.split(r"^.*==== job funasr-recipe \(\d+\), attempt \d+:.*$", log, flags=re.M)[1:]


def test_the_time_limit_signal_stops_run_sh_alone_and_the_job_requeues(cluster: SlurmCluster,
                                                                       tmp_path: Path) -> None:
    recipe = tmp_path / "recipe"
    (recipe / "slurm").mkdir(parents=True)
    (recipe / "run.sh").write_text(STAND_IN_RUN_SH)
    (recipe / "run.sh").chmod(0o755)
    shutil.copy(ROOT / "slurm" / "run.sbatch", recipe / "slurm" / "run.sbatch")
    started = time.monotonic()
    # 2 minutes: under the directive's 120 s of warning from the start; Slurm checks limits every 30 s.
    job = submit(cluster, recipe, "--time=2", "slurm/run.sbatch", "--stage", "2")
    final = cluster.wait_state(job, {"COMPLETED"}, timeout=240, until=lambda j: j["Restarts"] != "0",
                               job_log=recipe / JOB_LOG.format(job=job))
    log = (recipe / JOB_LOG.format(job=job)).read_text()
    assert final["Restarts"] == "1" and final["ExitCode"] == "0:0", (final, log)
    first, second = attempts(log)  # one log, appended to
    assert "SIGTERM: stopping run.sh on every node" in first, log
    for node in (0, 1):
        assert f"node {node}: SIGTERM, checkpoint saved" in first
        assert f"node {node}: resumed and finished" in second
    assert f"requeueing job {job} (1 of at most 10)" in first and "finished in" in second
    assert not (recipe / "child_got_sigterm").exists(), "the stop reached run.sh's children too"
    assert not (recipe / "signalled_while_saving").exists(), "a node was stopped again while saving"
    print(f"time limit signal, stop, requeue, second attempt: {time.monotonic() - started:.0f} s")


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of this checkout's code as a git checkout of its own (tracked and untracked files, not the
    ignored ones), sharing its venv: the job writes data/, dump/, exp/ and logs/ there."""
    copy = tmp_path_factory.mktemp("checkout") / "recipe"
    names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, names):
        src = ROOT / name
        if src.is_file():  # a tracked file deleted in the work tree is not copied
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, copy / name, follow_symlinks=False)
    (copy / ".venv").symlink_to((ROOT / ".venv").resolve())
    commit = ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "the code under test"]
    for cmd in (["init", "-q"], ["add", "-A"], commit):
        subprocess.run(["git", *cmd], cwd=copy, check=True, capture_output=True)
    return copy


def rank0_steps(text: str) -> list[int]:
    return [int(s) for s in re.findall(r"train, rank: 0, .*?total step: (\d+)", text)]


def test_two_node_demo_stopped_mid_epoch_is_requeued_resumes_and_finishes(cluster: SlurmCluster,
                                                                          checkout: Path) -> None:
    started = time.monotonic()
    job = submit(cluster, checkout, "slurm/run.sbatch", *TRAIN, cpus=2)
    train_log = checkout / "exp" / "tiny_sensevoice" / "train.log"
    deadline = time.monotonic() + 900
    while len(rank0_steps(train_log.read_text() if train_log.exists() else "")) < 4:
        state = cluster.job(job).get("JobState")
        assert state in ("PENDING", "RUNNING") and time.monotonic() < deadline, (
            state, (checkout / JOB_LOG.format(job=job)).read_text()[-4000:])
        time.sleep(1.0)
    stopped = time.monotonic()
    # What the directive --signal=B:TERM@120 sends before the time limit: SIGTERM to the batch shell.
    cluster.run("scancel", "--batch", "--signal=TERM", str(job))
    final = cluster.wait_state(job, {"COMPLETED"}, timeout=900, until=lambda j: j["Restarts"] != "0",
                               job_log=checkout / JOB_LOG.format(job=job))
    log = (checkout / JOB_LOG.format(job=job)).read_text()
    assert final["Restarts"] == "1" and final["ExitCode"] == "0:0", (final, log[-6000:])
    first, second = attempts(log)
    saved = {}
    for node in (0, 1):  # run.sh's trap on each node (local/run_lib.sh preempted_exit)
        found = re.search(rf"\[node{node}\] stopped by a signal after saving a checkpoint mid-epoch "
                          r"\((.*)\); the same command continues there", first)
        assert found, first[-6000:]
        saved = json.loads(found.group(1))
    assert f"exit {EXIT_PREEMPTED}); requeueing job {job}" in first, first[-3000:]
    assert saved["epoch"] == 0 and saved["step_in_epoch"] > 0, saved
    # The requeued run: stages 0 and 1 are done, training continues with the batch after the checkpoint.
    assert "is done; skipping" in second and "Successfully finished stages 0-2" in second, second[-6000:]
    assert f"rank 0: epoch 0 resumes after {saved['step_in_epoch']} batches" in second, second[-6000:]
    # funasr logs every 2nd update of the resumed loop: its first line is the checkpoint's step + 1 or + 2
    # (a run from scratch would log step 2 again).
    assert saved["total_step"] < rank0_steps(second)[0] <= saved["total_step"] + 2, (saved, second[-3000:])
    assert (checkout / "exp" / "tiny_sensevoice" / ".train.done").exists()
    # The job's log grew in the checkout's logs/, untracked, while both nodes hashed their code.
    status = subprocess.run(["git", "status", "--porcelain"], cwd=checkout, capture_output=True,
                            text=True).stdout
    assert "?? logs/" in status.splitlines(), status
    report = json.loads((checkout / "exp" / "tiny_sensevoice" / "preflight.json").read_text())
    assert report["ok"] and [n["agree"]["code"]["uncommitted"] for n in report["nodes"]] == ["clean"] * 2
    print(f"two-node demo: stopped {stopped - started:.0f} s after submission, {saved['seconds_to_save']} s "
          f"to save, finished {time.monotonic() - started:.0f} s after submission")

