"""The preflight's first checks, fast (no run.sh, no torchrun, no TCPStore): the master address resolved
in seconds with a message naming it, and the code hash the nodes compare, which leaves out what the
recipe writes inside the checkout (logs/, exp/, ...) but sees an edited program."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from funasr_recipe.core.cli import EXIT_BAD_INPUT
from funasr_recipe.core.rejections import BadInputError
from funasr_recipe.dist import preflight
from funasr_recipe.dist.node_report import code_state
from tests.helpers.run_sh import ROOT

UNRESOLVABLE = "no-such-host.invalid"  # RFC 6761: .invalid never resolves


def test_an_unresolvable_master_addr_is_bad_input_naming_it() -> None:
    started = time.monotonic()
    with pytest.raises(BadInputError, match=rf"--master-addr '{UNRESOLVABLE}' does not resolve on this node"):
        preflight.resolve_master(UNRESOLVABLE, 29500)
    assert time.monotonic() - started < preflight.RESOLVE_TIMEOUT
    assert preflight.resolve_master("127.0.0.1", 29500) == ["127.0.0.1"]


def test_a_resolver_that_hangs_or_fails_is_a_failure_in_time(monkeypatch: pytest.MonkeyPatch) -> None:
    def hangs(*args, **kwargs):  # type: ignore[no-untyped-def]
        time.sleep(5)

    monkeypatch.setattr(socket, "getaddrinfo", hangs)
    started = time.monotonic()
    with pytest.raises(preflight.PreflightFailed, match=r"--master-addr 'node0' did not resolve within 0s"):
        preflight.resolve_master("node0", 29500, timeout=0.3)
    assert time.monotonic() - started < 2

    def fails(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    monkeypatch.setattr(socket, "getaddrinfo", fails)
    with pytest.raises(preflight.PreflightFailed, match="could not be resolved on this node.*Temporary"):
        preflight.resolve_master("node0", 29500)


def test_local_preflight_exits_2_in_a_second_for_an_unresolvable_master(tmp_path: Path) -> None:
    """As run.sh starts it on node 1: without the check, the TCPStore retried for --timeout seconds."""
    started = time.monotonic()
    res = subprocess.run(
        [sys.executable, "-m", "local.preflight", "--nnodes", "2", "--node-rank", "1", "--master-addr",
         UNRESOLVABLE, "--master-port", "29999", "--nproc-per-node", "1", "--device", "cpu",
         "--config", "conf/tiny_sensevoice.yaml", "--ds-config", "ds_configs/ds_stage1_bf16.json",
         "--exp-dir", str(tmp_path / "exp"), "--timeout", "600"],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == EXIT_BAD_INPUT, res.stderr[-2000:]
    assert f"--master-addr '{UNRESOLVABLE}' does not resolve" in res.stderr
    assert "Traceback" not in res.stderr and time.monotonic() - started < 60


def test_node_0_warns_when_the_master_addr_is_not_its_own(caplog: pytest.LogCaptureFixture,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(preflight, "resolve_master", lambda addr, port: ["192.0.2.1"])  # TEST-NET-1
    setup = preflight.PreflightSetup(inputs=None, node_rank=0, nnodes=2, master_addr="elsewhere",  # type: ignore[arg-type]
                                     master_port=1, nproc_per_node=1, device="cpu", sizes_mib=(), timeout=1)
    assert preflight.check_master(setup) == ["192.0.2.1"]
    assert "none of which is an address of this machine" in caplog.text


# ---- the code hash -----------------------------------------------------------------------------------
def _checkout(root: Path) -> None:
    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)
    (root / "local").mkdir(parents=True)
    (root / "local" / "train.py").write_text("x = 1\n")
    git("init", "-q")
    git("add", "local/train.py")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "a")


def test_what_the_recipe_writes_in_the_checkout_is_not_code(tmp_path: Path) -> None:
    """No .gitignore here: the rules are the code hash's own, not the checkout's."""
    _checkout(tmp_path)
    assert code_state(tmp_path)["uncommitted"] == "clean"
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "funasr-recipe.12.out").write_text("a log that grows while the nodes compare\n")
    (tmp_path / "exp" / "tiny").mkdir(parents=True)
    (tmp_path / "exp" / "tiny" / "replay.sh").write_text("#!/bin/sh\n")
    (tmp_path / "exp" / "tiny" / "model.pt").write_bytes(b"\0" * 8)
    (tmp_path / "data" / "dev").mkdir(parents=True)
    (tmp_path / "data" / "dev" / "data.jsonl").write_text("{}\n")
    (tmp_path / "slurm-12.out").write_text("sbatch's default log\n")
    (tmp_path / "local" / "__pycache__").mkdir()
    (tmp_path / "local" / "__pycache__" / "train.cpython-311.pyc").write_bytes(b"\1")
    (tmp_path / "my_exp" / "x").mkdir(parents=True)  # --exp-dir my_exp/x: the run's own dir
    (tmp_path / "my_exp" / "x" / "train.log").write_text("epoch 1\n")
    assert code_state(tmp_path, (Path("my_exp/x"), tmp_path / "data"))["uncommitted"] == "clean"
    with_log = code_state(tmp_path)["uncommitted"]  # my_exp/ is nobody's output here: untracked code
    (tmp_path / "logs" / "funasr-recipe.12.out").write_text("more lines\n")
    assert code_state(tmp_path)["uncommitted"] == with_log


def test_an_edited_or_new_program_changes_the_code_hash(tmp_path: Path) -> None:
    _checkout(tmp_path)
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "a.out").write_text("x\n")
    (tmp_path / "local" / "train.py").write_text("x = 2\n")
    edited = code_state(tmp_path)["uncommitted"]
    (tmp_path / "local" / "new.py").write_text("y = 1\n")
    added = code_state(tmp_path)["uncommitted"]
    assert "clean" not in (edited, added) and edited != added
