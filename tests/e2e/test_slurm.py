"""slurm/run.sbatch under a simulated Slurm job: fake srun, scontrol and scancel, one task per node.

The fake srun runs its command once per node of the job, concurrently, with the variables a real one
sets (SLURM_NODEID, SLURM_PROCID, ...); each node's output goes to tasks/node<i>.log. run.sh with
--stage 9 --stop-stage 9 runs no stage but logs the node options it derived, which are checked here.
The stop and requeue rules run against a stand-in run.sh (no training): SIGTERM to the batch shell
reaches run.sh through the step's SIGURG, and its exit 75 is requeued, or not, by the documented rule.
tests/e2e/test_slurm_real.py runs the same under a real slurmctld and slurmd.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from funasr_recipe.compat.preemption import EXIT_PREEMPTED
from funasr_recipe.data.corpus import CorpusInfo, write_corpus_info

ROOT = Path(__file__).resolve().parents[2]
SBATCH = ROOT / "slurm" / "run.sbatch"
OVERRIDE = "++dataset_conf.batch_size=8000"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")

FAKE_SRUN = r"""#!/usr/bin/env bash
# srun of a job of SLURM_NNODES nodes gpu07, gpu08, ...: one task per node, all at once.
set -u
printf '%s\n' "$@" > "${FAKE_SLURM_OUT}/srun.args"
opts=()
while [ $# -gt 0 ] && [[ $1 == -* ]]; do opts+=("$1"); shift; done
printf '%s\n' "${opts[@]}" | grep -qx -- --ntasks-per-node=1 \
  || { echo "fake srun: called without --ntasks-per-node=1: ${opts[*]}" >&2; exit 97; }
pids=()
for ((i = 0; i < SLURM_NNODES; i++)); do
  SLURM_NODEID=$i SLURM_PROCID=$i SLURM_LOCALID=0 SLURMD_NODENAME=gpu0$((7 + i)) \
    "$@" > "${FAKE_SLURM_OUT}/node$i.log" 2>&1 &
  pids+=($!)
done
printf '%s\n' "${pids[@]}" > "${FAKE_SLURM_OUT}/task.pids"
rc=0
for p in "${pids[@]}"; do wait "$p" || { r=$?; [ "$r" -le "$rc" ] || rc=$r; }; done
exit $rc
"""

# Only the calls of these tests are known: any other is a mistake in run.sbatch.
FAKE_SCONTROL = r"""#!/usr/bin/env bash
case "$*" in
  "show hostnames gpu[07-08]") printf 'gpu07\ngpu08\n' ;;
  "show hostnames gpu07") echo gpu07 ;;
  "-o show node gpu07") echo "NodeName=gpu07 Arch=x86_64 NodeAddr=10.1.0.7 NodeHostName=gpu07 Port=0" ;;
  "-o show job ${SLURM_JOB_ID}") echo "JobId=${SLURM_JOB_ID} Requeue=${FAKE_REQUEUE:-1} Restarts=0" ;;
  "requeue ${SLURM_JOB_ID}") echo "${SLURM_JOB_ID}" >> "${FAKE_SLURM_OUT}/requeued" ;;
  *) echo "fake scontrol: unexpected call: $*" >&2; exit 1 ;;
esac
"""

# scancel --signal=URG <job> (run.sbatch's stop): the signal to every task of the step, as slurmstepd
# sends it to every process of the step.
FAKE_SCANCEL = r"""#!/usr/bin/env bash
[ "$*" = "--signal=URG ${SLURM_JOB_ID}" ] || { echo "fake scancel: unexpected call: $*" >&2; exit 1; }
echo "$*" >> "${FAKE_SLURM_OUT}/scancel.calls"
while read -r p; do kill -URG "$p"; done < "${FAKE_SLURM_OUT}/task.pids"
"""

# A run.sh that "trains" until SIGTERM and then exits 75, as run.sh does once the ranks saved a
# checkpoint; FAKE_RC makes it exit at once instead.
FAKE_RUN_SH = r"""#!/usr/bin/env bash
[ -z "${FAKE_RC:-}" ] || exit "${FAKE_RC}"
trap 'echo "run.sh on node ${SLURM_NODEID}: SIGTERM, checkpoint saved"; exit 75' TERM
touch "${FAKE_SLURM_OUT}/ready${SLURM_NODEID}"
while :; do sleep 0.2 & wait $!; done
"""

NODE_LINE = re.compile(r"node (\d+)/(\d+), master (\S+):(\d+), .* processes per node, exp (.+)$", re.M)


def expected_port(job_id: int) -> int:
    return 20000 + job_id % 12000  # as run.sbatch derives it


def fake_slurm(tmp_path: Path, job_id: int, nodelist: str, nnodes: int,
               env: dict | None = None) -> tuple[dict, Path]:
    """The environment of run.sbatch as Slurm starts it on the job's first node (fake srun, scontrol and
    scancel first on PATH) and the folder of the nodes' logs."""
    bin_dir, out = tmp_path / "bin", tmp_path / "tasks"
    bin_dir.mkdir(exist_ok=True)
    out.mkdir(exist_ok=True)
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL), ("scancel", FAKE_SCANCEL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    base = {k: v for k, v in os.environ.items()
            if k not in ("NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "RECIPE_DIR")
            and not k.startswith(("SLURM_", "SRUN_", "RECIPE_"))}
    job = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "FAKE_SLURM_OUT": str(out),
           "SLURM_JOB_ID": str(job_id), "SLURM_JOB_NAME": "funasr-recipe", "SLURM_JOB_NODELIST": nodelist,
           "SLURM_NNODES": str(nnodes), "SLURM_SUBMIT_DIR": str(ROOT)}
    return {**base, **job, **(env or {})}, out


def slurm_job(tmp_path: Path, job_id: int, nodelist: str, nnodes: int, *args: str,
              env: dict | None = None) -> tuple[subprocess.CompletedProcess, Path]:
    """Run run.sbatch as Slurm would on the job's first node, from a cwd that is not the recipe root;
    returns the result and the folder of the nodes' logs."""
    job_env, out = fake_slurm(tmp_path, job_id, nodelist, nnodes, env)
    res = subprocess.run(["bash", str(SBATCH), *args], cwd=tmp_path, capture_output=True, text=True,
                         env=job_env, timeout=120)
    return res, out


def fake_recipe(tmp_path: Path) -> Path:
    """A recipe root whose run.sh is FAKE_RUN_SH, with this checkout's run.sbatch."""
    recipe = tmp_path / "recipe"
    (recipe / "slurm").mkdir(parents=True)
    (recipe / "run.sh").write_text(FAKE_RUN_SH)
    (recipe / "run.sh").chmod(0o755)
    shutil.copy(SBATCH, recipe / "slurm" / "run.sbatch")
    return recipe


def stage9_args(tmp_path: Path) -> tuple[list[str], Path]:
    """Options that run no stage; the exp dir's name holds a space, so a word-split "$@" shows."""
    # NOTE: node 0's closing summary reads corpus.json when --stop-stage is 3 or more.
    data = tmp_path / "data"
    write_corpus_info(data, CorpusInfo(corpus="fsdd", corpus_dir="", train_set="dev", valid_set="dev",
                                       test_sets=["dev"], language="en"))
    exp = tmp_path / "exp dir"
    return ["--stage", "9", "--stop-stage", "9", "--data-dir", str(data), "--exp-dir", str(exp),
            "--", OVERRIDE], exp


def node_options(log: str) -> tuple[int, int, str, int, str]:
    found = NODE_LINE.findall(log)
    assert len(found) == 1, log
    rank, nnodes, addr, port, exp = found[0]
    return int(rank), int(nnodes), addr, int(port), exp


# A NODE_RANK or MASTER_ADDR left in the submitting shell reaches the job too: Slurm's must win.
@pytest.mark.parametrize("stale", [{}, {"NNODES": "1", "NODE_RANK": "0", "MASTER_ADDR": "login1",
                                        "MASTER_PORT": "29500"}], ids=["clean", "stale-env"])
def test_two_nodes_derive_ranks_master_and_port(tmp_path: Path, stale: dict) -> None:
    args, exp = stage9_args(tmp_path)
    res, out = slurm_job(tmp_path, 123456, "gpu[07-08]", 2, *args, env=stale)
    logs = [(out / f"node{i}.log").read_text() if (out / f"node{i}.log").exists() else "" for i in range(2)]
    assert res.returncode == 0, res.stderr + "".join(logs)
    port = expected_port(123456)
    # node 0's NodeAddr: a NodeName need not resolve
    assert f"master 10.1.0.7:{port}" in res.stderr and "2 node(s) gpu[07-08]" in res.stderr
    srun_args = (out / "srun.args").read_text().splitlines()
    assert "--kill-on-bad-exit=1" in srun_args and srun_args[-len(args):] == args
    for i, log in enumerate(logs):
        assert node_options(log) == (i, 2, "10.1.0.7", port, str(exp)), log
        assert f"--exp-dir {exp} -- {OVERRIDE}" in log  # run.sh's own echo of its command line
        assert "Successfully finished stages 9-9" in log
    assert exp.is_dir()


def test_one_node_job_found_from_recipe_dir(tmp_path: Path) -> None:
    args, exp = stage9_args(tmp_path)
    # Submitted from elsewhere: RECIPE_DIR names the recipe instead.
    res, out = slurm_job(tmp_path, 7, "gpu07", 1, *args,
                         env={"SLURM_SUBMIT_DIR": str(tmp_path), "RECIPE_DIR": str(ROOT)})
    assert res.returncode == 0, res.stderr
    log = (out / "node0.log").read_text()
    assert node_options(log) == (0, 1, "10.1.0.7", expected_port(7), str(exp)), log
    assert expected_port(7) != expected_port(123456)  # another job on the node gets another port


def test_a_failing_node_fails_the_job(tmp_path: Path) -> None:
    res, out = slurm_job(tmp_path, 1, "gpu[07-08]", 2, "--no-such-option", "1")
    assert res.returncode != 0 and "finished in" not in res.stderr
    for i in range(2):
        assert "unknown option --no-such-option" in (out / f"node{i}.log").read_text()


def test_no_recipe_in_submit_dir_is_refused_before_srun(tmp_path: Path) -> None:
    res, out = slurm_job(tmp_path, 1, "gpu[07-08]", 2, "--stage", "9",
                         env={"SLURM_SUBMIT_DIR": str(tmp_path)})
    assert res.returncode == 2 and "submit from the recipe root, or set RECIPE_DIR" in res.stderr
    assert not (out / "srun.args").exists()


# ---- stopping and requeueing ------------------------------------------------------------------------
def test_sigterm_to_the_batch_shell_stops_run_sh_on_every_node_and_requeues(tmp_path: Path) -> None:
    """As Slurm's --signal=B:TERM@120 before the time limit (or scancel --batch --signal=TERM)."""
    recipe = fake_recipe(tmp_path)
    env, out = fake_slurm(tmp_path, 41, "gpu[07-08]", 2, {"RECIPE_DIR": str(recipe)})
    with open(tmp_path / "batch.err", "w") as err:
        batch = subprocess.Popen(["bash", str(recipe / "slurm" / "run.sbatch"), "--stage", "2"], cwd=tmp_path,
                                 env=env, stdout=err, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while not all((out / f"ready{i}").exists() for i in range(2)):
        assert batch.poll() is None and time.monotonic() < deadline, (tmp_path / "batch.err").read_text()
        time.sleep(0.1)
    batch.send_signal(signal.SIGTERM)
    assert batch.wait(timeout=60) == 0
    log = (tmp_path / "batch.err").read_text()
    assert "SIGTERM: stopping run.sh on every node" in log, log
    assert "requeueing job 41 (1 of at most 10)" in log, log
    assert (out / "requeued").read_text() == "41\n"
    assert (out / "scancel.calls").read_text() == "--signal=URG 41\n"  # once, to the step, not to srun
    for i in range(2):
        assert f"run.sh on node {i}: SIGTERM, checkpoint saved" in (out / f"node{i}.log").read_text()


@pytest.mark.parametrize(("env", "requeued", "why"), [
    ({}, True, "requeueing job 42 (4 of at most 10)"),
    ({"RECIPE_REQUEUE": "false"}, False, "not requeued: RECIPE_REQUEUE=false"),
    ({"SLURM_RESTART_COUNT": "10"}, False, "not requeued: requeued 10 times already (RECIPE_MAX_REQUEUES"),
    ({"RECIPE_MAX_REQUEUES": "3"}, False, "requeued 3 times already (RECIPE_MAX_REQUEUES=3)"),
    ({"FAKE_REQUEUE": "0"}, False, "the job is not requeueable (sbatch --no-requeue, or scontrol update"),
], ids=["default", "off", "cap", "own-cap", "no-requeue"])
def test_exit_75_requeues_by_the_rule(tmp_path: Path, env: dict, requeued: bool, why: str) -> None:
    recipe = fake_recipe(tmp_path)
    res, out = slurm_job(tmp_path, 42, "gpu[07-08]", 2, "--stage", "2",
                         env={"RECIPE_DIR": str(recipe), "FAKE_RC": str(EXIT_PREEMPTED),
                              "SLURM_RESTART_COUNT": "3", **env})
    assert why in res.stderr, res.stderr
    assert "attempt 4:" in res.stderr or "attempt 11:" in res.stderr
    assert res.returncode == (0 if requeued else EXIT_PREEMPTED), res.stderr
    assert (out / "requeued").exists() == requeued


@pytest.mark.parametrize("rc", [1, 143])
def test_a_failure_or_a_stop_from_elsewhere_is_not_requeued(tmp_path: Path, rc: int) -> None:
    """143 is requeued only after this shell's own stop: here run.sh was stopped by something else."""
    res, out = slurm_job(tmp_path, 43, "gpu07", 1, env={"RECIPE_DIR": str(fake_recipe(tmp_path)),
                                                        "FAKE_RC": str(rc)})
    assert res.returncode == rc and f"run.sh failed (exit {rc})" in res.stderr, res.stderr
    assert not (out / "requeued").exists()


def test_bad_requeue_settings_are_refused(tmp_path: Path) -> None:
    res, out = slurm_job(tmp_path, 44, "gpu07", 1, env={"RECIPE_REQUEUE": "yes"})
    assert res.returncode == 2 and "RECIPE_REQUEUE must be true or false, got 'yes'" in res.stderr
    assert not (out / "srun.args").exists()
