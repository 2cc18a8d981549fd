"""A real Slurm on this machine for the tests: munged, slurmctld and two slurmd (n1, n2), Debian's 22.05.

Everything lives in one temporary dir: slurm.conf, the munge key and socket, the daemons' state, spool,
pid and log files. The nodes are n1 and n2 on 127.0.0.1 (one slurmd each, ``slurmd -N n1``, on ports of
their own); the partition ``test`` holds both. Client commands find the cluster through SLURM_CONF in
``cluster.env``. Nothing under /etc or /run is written; the daemons run as root, the tests' user.

Reads  nothing; writes <root>/ (the cluster's files); installs slurmd, slurmctld, slurm-client and munge
       with apt-get when they are missing (once, as setup.sh would on CI).

  with start_cluster(tmp_path / "slurm") as cluster:       # or a fixture: cluster_or_skip
      job = cluster.sbatch(["--nodes=2", "script.sh"], cwd=tmp_path)
      cluster.wait_state(job, {"COMPLETED"})
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import pytest

PACKAGES = ("slurmd", "slurmctld", "slurm-client", "munge")
DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "sinfo")
NODES = ("n1", "n2")
# States a job does not leave (squeue/scontrol's names); REQUEUED ones go back to PENDING.
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
         "DEADLINE", "PREEMPTED"}
_install_tried: list[str] = []  # the reason it failed, once per session (apt-get is slow)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def missing_reason() -> str | None:
    """Why Slurm cannot be had here (None: it is installed, or apt-get just installed it)."""
    if all(shutil.which(d) or Path("/usr/sbin", d).exists() for d in DAEMONS):
        return None
    if _install_tried:
        return _install_tried[0] or None
    reason = None
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        reason = "Slurm is not installed and apt-get cannot install it here (needs root and apt-get)"
    else:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        res = subprocess.run(["apt-get", "install", "-y", *PACKAGES], capture_output=True, text=True,
                             env=env, timeout=900)
        if res.returncode != 0:
            reason = f"apt-get install {' '.join(PACKAGES)} failed: {res.stderr.strip()[-300:]}"
        elif not all(shutil.which(d) or Path("/usr/sbin", d).exists() for d in DAEMONS):
            reason = f"apt-get installed {' '.join(PACKAGES)}, but not all of {', '.join(DAEMONS)}"
    _install_tried.append(reason or "")
    return reason


@dataclass
class SlurmCluster:
    root: Path
    env: dict[str, str]                 # the environment client commands need (SLURM_CONF)
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    output: IO[str] | None = None       # the daemons' own stdout and stderr (root/daemons.out)

    def run(self, *cmd: str, check: bool = True, timeout: float = 60, cwd: Path | None = None,
            env: dict | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=check, cwd=cwd,
                              env={**self.env, **(env or {})})

    def sbatch(self, args: list[str], cwd: Path, env: dict | None = None) -> int:
        """Submit; returns the job id."""
        res = self.run("sbatch", "--parsable", *args, cwd=cwd, env=env)
        return int(res.stdout.strip().split(";")[0])

    def job(self, job_id: int) -> dict[str, str]:
        """scontrol's fields of the job (JobState, Restarts, ExitCode, ...); empty once it is forgotten."""
        res = self.run("scontrol", "-o", "show", "job", str(job_id), check=False)
        out = {}
        for word in res.stdout.split():
            key, sep, value = word.partition("=")
            if sep:
                out[key] = value
        return out

    def wait_state(self, job_id: int, states: set[str], timeout: float = 600,
                   until: Callable[[dict[str, str]], bool] | None = None,
                   job_log: Path | None = None) -> dict[str, str]:
        """Poll until the job is in one of states (and ``until(job)`` holds); its fields. Fails at a
        final state that is not asked for, naming it, with the tail of job_log when given."""
        deadline = time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            state = job.get("JobState", "?")
            if state in states and (until is None or until(job)):
                return job
            tail = job_log.read_text()[-6000:] if job_log and job_log.exists() else ""
            assert state not in FINAL - states, f"job {job_id} ended {state}: {job}\n{tail}"
            assert time.monotonic() < deadline, (f"job {job_id} still {state} after {timeout:.0f}s: "
                                                 f"{job}\n{tail}")
            time.sleep(1.0)

    def idle_nodes(self) -> set[str]:
        res = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False)
        return {line.split()[0] for line in res.stdout.splitlines() if line.split()[1:] == ["idle"]}

    def logs(self) -> str:
        """The daemons' logs' tails: what to show when the cluster misbehaves."""
        parts = []
        for log in sorted(self.root.glob("*.log")):
            parts.append(f"--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-30:]))
        return "\n".join(parts)

    def stop(self) -> None:
        """Cancel every job, then stop the daemons (slurmd first: they end their jobs' steps)."""
        self.run("scancel", "--full", "--partition", "test", check=False)
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline and self.run("squeue", "-h", check=False).stdout.strip():
            time.sleep(1.0)
        for name in sorted(self.procs, key=lambda n: (not n.startswith("slurmd"), n == "munged")):
            proc = self.procs[name]
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)
        if self.output is not None:
            self.output.close()


def _conf(root: Path, ctld_port: int, node_ports: dict[str, int], cpus: int) -> str:
    # NOTE: proctrack/linuxproc and task/none: no cgroups, which a container may not offer;
    # SlurmdParameters=config_overrides: both nodes claim this machine's cores without being drained for
    # sharing them; ReturnToService=2: a node that was down comes back when its slurmd registers.
    lines = [
        "ClusterName=recipetest", "SlurmctldHost=localhost", f"SlurmctldPort={ctld_port}",
        "SlurmUser=root", "SlurmdUser=root", "AuthType=auth/munge", "CredType=cred/munge",
        # cred_expire: also how long a requeued job waits before it may start again (120 s by default)
        f"AuthInfo=socket={root}/munge/munge.socket,cred_expire=10",
        f"StateSaveLocation={root}/state",
        f"SlurmdSpoolDir={root}/spool/%n", f"SlurmctldPidFile={root}/slurmctld.pid",
        f"SlurmdPidFile={root}/slurmd.%n.pid", f"SlurmctldLogFile={root}/slurmctld.log",
        f"SlurmdLogFile={root}/slurmd.%n.log", "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core", "SchedulerType=sched/builtin",
        "ReturnToService=2", "MpiDefault=none", "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none", "JobCompType=jobcomp/none",
        "SlurmdParameters=config_overrides", "JobRequeue=1", "KillWait=30", "MinJobAge=600",
        "InactiveLimit=0", "SlurmdTimeout=60", "SlurmctldTimeout=60", "MessageTimeout=20",
        "SchedulerParameters=sched_interval=2", "PriorityType=priority/basic",
        # Job ids, and with them run.sbatch's rendezvous port (20000 + id % 12000), not those of
        # another cluster of these tests running on the machine at the same time.
        f"FirstJobId={random.randrange(1000, 11000)}",
    ]
    for name, port in node_ports.items():
        lines.append(f"NodeName={name} NodeHostname={socket.gethostname()} NodeAddr=127.0.0.1 Port={port} "
                     f"CPUs={cpus} State=UNKNOWN")
    lines.append(f"PartitionName=test Nodes={','.join(node_ports)} Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


def _start_munge(root: Path, procs: dict[str, subprocess.Popen]) -> None:
    d = root / "munge"
    d.mkdir(mode=0o700)
    key = d / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    # --force: munged refuses a socket dir it does not trust (a temporary dir's parents) without it.
    procs["munged"] = subprocess.Popen(
        ["munged", "--foreground", "--force", f"--socket={d}/munge.socket", f"--key-file={key}",
         f"--pid-file={d}/munged.pid", f"--log-file={root}/munged.log", f"--seed-file={d}/munged.seed"],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    _wait(lambda: (d / "munge.socket").exists(), "munged's socket", procs["munged"], 20)


def _wait(cond, what: str, proc: subprocess.Popen | None, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what}: {proc.args[0]} exited {proc.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {what} after {timeout:.0f}s")
        time.sleep(0.3)


@contextmanager
def start_cluster(root: Path, cpus: int | None = None) -> Iterator[SlurmCluster]:
    """The cluster, its nodes idle; torn down on exit. RuntimeError (with the daemons' logs) when a
    daemon does not start."""
    root.mkdir(parents=True, exist_ok=True)
    for d in ("state", *(f"spool/{n}" for n in NODES)):
        (root / d).mkdir(parents=True, exist_ok=True)
    conf = root / "slurm.conf"
    conf.write_text(_conf(root, free_port(), {n: free_port() for n in NODES}, cpus or os.cpu_count() or 1))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_"))}
    cluster = SlurmCluster(root=root, env={**env, "SLURM_CONF": str(conf)})
    try:
        _start_munge(root, cluster.procs)
        out = cluster.output = open(root / "daemons.out", "w")  # closed by stop()
        cluster.procs["slurmctld"] = subprocess.Popen(["slurmctld", "-D", "-i", "-f", str(conf)],
                                                      env=cluster.env, stdout=out, stderr=subprocess.STDOUT)
        _wait(lambda: cluster.run("scontrol", "ping", check=False).stdout.count("UP") > 0, "slurmctld",
              cluster.procs["slurmctld"], 60)
        for n in NODES:
            cluster.procs[f"slurmd.{n}"] = subprocess.Popen(
                ["slurmd", "-D", "-N", n, "-f", str(conf)], env=cluster.env, stdout=out,
                stderr=subprocess.STDOUT)
        _wait(lambda: cluster.idle_nodes() >= set(NODES), "idle nodes n1 n2 in sinfo", None, 90)
    except (RuntimeError, OSError, subprocess.SubprocessError) as e:
        logs = cluster.logs()
        cluster.stop()
        raise RuntimeError(f"{e}\n{logs}") from e
    try:
        yield cluster
    finally:
        cluster.stop()


def cluster_or_skip(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """The body of a test module's cluster fixture (one cluster per module), skipping its tests with
    the reason where Slurm cannot be installed or its daemons do not start:

        @pytest.fixture(scope="module")
        def cluster(tmp_path_factory): yield from cluster_or_skip(tmp_path_factory)
    """
    reason = missing_reason()
    if reason:
        pytest.skip(reason)
    if os.geteuid() != 0:  # slurmd starts each job's processes as the job's user
        pytest.skip("the Slurm daemons of these tests run as root (SlurmUser=root), and this is not root")
    ctx = start_cluster(tmp_path_factory.mktemp("slurm"))
    try:
        cluster = ctx.__enter__()
    except RuntimeError as e:
        pytest.skip(f"the Slurm daemons did not start: {str(e)[:2000]}")
    try:
        yield cluster
    finally:
        ctx.__exit__(None, None, None)
