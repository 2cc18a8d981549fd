"""slurm/run.sbatch under a simulated Slurm job: fake srun and scontrol, one run.sh per node.

The fake srun runs its command once per node of the job, concurrently, with the variables a real one
sets (SLURM_NODEID, SLURM_PROCID, ...); each node's output goes to tasks/node<i>.log. run.sh with
--stage 9 --stop-stage 9 runs no stage but logs the node options it derived, which are checked here.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

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
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
exit $rc
"""

# Only the node lists of these tests are known: any other call is a mistake in run.sbatch.
FAKE_SCONTROL = r"""#!/usr/bin/env bash
case "$*" in
  "show hostnames gpu[07-08]") printf 'gpu07\ngpu08\n' ;;
  "show hostnames gpu07") echo gpu07 ;;
  *) echo "fake scontrol: unexpected call: $*" >&2; exit 1 ;;
esac
"""

NODE_LINE = re.compile(r"node (\d+)/(\d+), master (\S+):(\d+), .* processes per node, exp (.+)$", re.M)


def expected_port(job_id: int) -> int:
    return 20000 + job_id % 12000  # as run.sbatch derives it


def slurm_job(tmp_path: Path, job_id: int, nodelist: str, nnodes: int, *args: str,
              env: dict | None = None) -> tuple[subprocess.CompletedProcess, Path]:
    """Run run.sbatch as Slurm would on the job's first node, from a cwd that is not the recipe root;
    returns the result and the folder of the nodes' logs."""
    bin_dir, out = tmp_path / "bin", tmp_path / "tasks"
    bin_dir.mkdir(exist_ok=True)
    out.mkdir(exist_ok=True)
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    base = {k: v for k, v in os.environ.items()
            if k not in ("NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "RECIPE_DIR")
            and not k.startswith(("SLURM_", "SRUN_"))}
    job = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "FAKE_SLURM_OUT": str(out),
           "SLURM_JOB_ID": str(job_id), "SLURM_JOB_NAME": "funasr-recipe", "SLURM_JOB_NODELIST": nodelist,
           "SLURM_NNODES": str(nnodes), "SLURM_SUBMIT_DIR": str(ROOT)}
    res = subprocess.run(["bash", str(SBATCH), *args], cwd=tmp_path, capture_output=True, text=True,
                         env={**base, **job, **(env or {})}, timeout=120)
    return res, out


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
    assert f"master gpu07:{port}" in res.stderr and "2 node(s) gpu[07-08]" in res.stderr
    srun_args = (out / "srun.args").read_text().splitlines()
    assert "--kill-on-bad-exit=1" in srun_args and srun_args[-len(args):] == args
    for i, log in enumerate(logs):
        assert node_options(log) == (i, 2, "gpu07", port, str(exp)), log
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
    assert node_options(log) == (0, 1, "gpu07", expected_port(7), str(exp)), log
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
