"""The preflight (stage -1, and the start of stage 2): two node processes on this machine over
127.0.0.1 through run.sh, agreeing and disagreeing; node 1 with an exp dir that is not node 0's; the
comparison, the table and the communication profiles as units."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from funasr_recipe.dist.bandwidth import bus_factor
from funasr_recipe.dist.comm_profile import exports, profile, resolve
from funasr_recipe.dist.compare import differences, node_table, warnings
from funasr_recipe.dist.node_report import code_state, data_digests, requirement_names, shard_list_digest
from tests.helpers.run_sh import ROOT
from tests.helpers.train_fixtures import free_port


def two_nodes(node_args: list[list[str]], cwd: Path = ROOT, timeout: int = 240,
              program: list[str] | None = None) -> list[subprocess.CompletedProcess]:
    """Start both nodes at once (each waits for the other) and wait for both. Their output goes to
    temporary files: a full pipe of one node, unread while the other is awaited, would stall both."""
    program = program or ["./run.sh"]
    env = {k: v for k, v in os.environ.items()
           if k not in ("NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT")}
    procs = []
    for rank, args in enumerate(node_args):
        err = tempfile.TemporaryFile("w+")
        procs.append((subprocess.Popen([*program, *args], cwd=cwd, env={**env, "NODE_RANK": str(rank)},
                                       stdout=err, stderr=subprocess.STDOUT, text=True), err))
    out = []
    for p, err in procs:
        p.wait(timeout=timeout)
        err.seek(0)
        text = err.read()
        err.close()
        out.append(subprocess.CompletedProcess(p.args, p.returncode, "", text))
    return out


def node_options(tmp_path: Path, rank: int, port: int, *more: str) -> list[str]:
    return ["--stage", "-1", "--stop-stage", "-1", "--nnodes", "2", "--node-rank", str(rank),
            "--master-addr", "127.0.0.1", "--master-port", str(port), "--nproc-per-node", "1",
            "--data-dir", str(tmp_path / "data"), "--dump-dir", str(tmp_path / "dump"),
            "--exp-dir", str(tmp_path / "exp"), *more]


def test_two_nodes_agree_and_print_the_table(tmp_path: Path) -> None:
    (tmp_path / "dump" / "train" / "shards").mkdir(parents=True)
    (tmp_path / "dump" / "train" / "data.jsonl").write_text('{"key": "a"}\n')
    (tmp_path / "dump" / "train" / "shards" / "feats.0.ark").write_bytes(b"x" * 10)
    port = free_port()
    res = two_nodes([node_options(tmp_path, r, port) for r in (0, 1)])
    for r, node in enumerate(res):
        assert node.returncode == 0, node.stderr[-3000:]
        assert "preflight | node  host" in node.stderr, f"node {r} prints no table"
        assert "exp:ok,dump:ok" in node.stderr
        assert "busbw GB/s" in node.stderr and "latency of an 8-byte all-reduce" in node.stderr
    report = json.loads((tmp_path / "exp" / "preflight.json").read_text())
    assert report["ok"] and not report["differences"] and len(report["nodes"]) == 2
    assert [row["size_mib"] for row in report["bandwidth"]["sizes"]] == [1, 16, 64, 256]
    assert all(row["busbw_gbps"] > 0 for row in report["bandwidth"]["sizes"])
    assert report["bandwidth"]["backend"] == "gloo" and report["bandwidth"]["world_size"] == 2
    assert report["nodes"][1]["shared"]["exp"]["status"] == "ok"
    assert abs(report["nodes"][1]["clock"]["offset_s"]) < 1.0  # one machine, one clock
    data = report["nodes"][0]["agree"]["data"]
    assert str(tmp_path / "dump" / "train" / "data.jsonl") in data and len(data) == 2
    assert not (tmp_path / "exp" / ".preflight").exists()  # the token is cleaned up


def test_a_different_config_on_node_1_stops_both_naming_node_1_and_the_file(tmp_path: Path) -> None:
    other = tmp_path / "tiny_sensevoice.yaml"
    other.write_text(
        (ROOT / "conf" / "tiny_sensevoice.yaml").read_text().replace("max_epoch: 12", "max_epoch: 13"))
    assert other.read_text() != (ROOT / "conf" / "tiny_sensevoice.yaml").read_text()
    port = free_port()
    res = two_nodes([node_options(tmp_path, 0, port),
                     node_options(tmp_path, 1, port, "--config", str(other))])
    for node in res:
        assert node.returncode == 1, node.stderr[-3000:]
        assert "node 1 (" in node.stderr and f"config {other} sha256" in node.stderr
        assert "differs from node 0's conf/tiny_sensevoice.yaml" in node.stderr
        assert "preflight failed" in node.stderr
    report = json.loads((tmp_path / "exp" / "preflight.json").read_text())
    assert not report["ok"] and report["bandwidth"] is None  # no bandwidth test on a failed check


def test_node_1_whose_exp_dir_is_not_node_0s_is_named(tmp_path: Path) -> None:
    """As on a node where the shared filesystem is not mounted: node 1's exp/ is another directory."""
    port = free_port()

    def args(rank: int) -> list[str]:
        return ["--nnodes", "2", "--node-rank", str(rank), "--master-addr", "127.0.0.1", "--master-port",
                str(port), "--nproc-per-node", "1", "--device", "cpu",
                "--config", "conf/tiny_sensevoice.yaml",
                "--ds-config", "ds_configs/ds_stage1_bf16.json", "--data-dir", str(tmp_path / "data"),
                "--dump-dir", str(tmp_path / "dump"), "--exp-dir", str(tmp_path / f"exp_node{rank}"),
                "--options", "same", "--sizes-mib", "1", "--timeout", "60"]
    res = two_nodes([args(0), args(1)], program=[sys.executable, "-m", "local.preflight"])
    for node in res:
        assert node.returncode == 1, node.stderr[-3000:]
        assert "node 1 (" in node.stderr and f"exp dir {tmp_path / 'exp_node1'} is not shared" in node.stderr
        assert "dump dir" not in node.stderr  # dump/ is the same directory for both


def test_missing_node_is_named_by_node_0(tmp_path: Path) -> None:
    res = subprocess.run(["./run.sh", *node_options(tmp_path, 0, free_port(), "--wait-timeout", "2")],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 1
    assert "node(s) 1 of 2 have not arrived at the preflight" in res.stderr and "--node-rank 1" in res.stderr


# ---- units ---------------------------------------------------------------------------------------------
def report(**agree) -> dict:
    base = {"code": {"git_rev": "a" * 40, "uncommitted": "clean"}, "versions": {"torch": "2.9.1"},
            "files": {"config": {"path": "conf/x.yaml", "sha256": "1" * 64}},
            "data": {"dump/t/data.jsonl": "2" * 64},
            "options": "config=conf/x.yaml nj=2"}
    base.update(agree)
    return {"host": "h", "agree": base, "shared": {}, "clock": {"offset_s": 0.0, "error_s": 0.0},
            "resources": {"device": "cpu", "processes": 1, "gpus": [],
                          "free_gib": {"exp": 100.0, "dump": 100.0},
                          "cpu": {"name": "x", "cores": 2, "os_cpus": 2,
                                  "mem_total_gib": 8, "mem_available_gib": 4}}}


@pytest.mark.parametrize(("agree", "expected"), [
    ({"versions": {"torch": "2.9.0"}}, "node 1 (h): torch 2.9.0 differs from node 0's 2.9.1"),
    ({"code": {"git_rev": "b" * 40, "uncommitted": "clean"}}, "git revision bbbbbbbbbbbb.. differs"),
    ({"code": {"git_rev": "a" * 40, "uncommitted": "c" * 64}}, "uncommitted changes (sha256 cccccccccccc..)"),
    ({"files": {"config": {"path": "conf/x.yaml", "sha256": "9" * 64}}},
     "config conf/x.yaml sha256 999999999999.. differs from node 0's conf/x.yaml 111111111111.."),
    ({"data": {"dump/t/data.jsonl": "absent"}}, "dump/t/data.jsonl sha256 absent differs"),
    ({"options": "config=conf/x.yaml nj=4"}, "has nj=4 where node 0 has nj=2"),
])
def test_each_difference_names_the_node_and_both_values(agree: dict, expected: str) -> None:
    assert differences([report(), report()]) == []
    found = differences([report(), report(**agree)])
    assert len(found) == 1 and expected in found[0], found


def test_unshared_dir_clock_and_busy_gpu() -> None:
    node1 = report()
    node1["shared"] = {"exp": {"path": "/x", "status": "missing: not there"}}
    node1["clock"] = {"offset_s": 7.5, "error_s": 0.01}
    node1["resources"]["gpus"] = [{"index": 3, "name": "H200", "total_gib": 140.0, "free_gib": 100.0}]
    assert any("exp dir /x is not shared with node 0" in d for d in differences([report(), node1]))
    found = warnings([report(), node1])
    assert any("+7.5 s off" in w for w in found) and any(
        "GPU 3 already has 40.0 of 140.0" in w for w in found)
    table = node_table([report(), node1])
    assert len(table) == 3 and "exp:missing" in table[2] and "1x H200" in table[2]


def test_code_state_sees_uncommitted_and_untracked_changes(tmp_path: Path) -> None:
    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)
    git("init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    git("add", "a.py")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "a")
    clean = code_state(tmp_path)
    assert clean["uncommitted"] == "clean" and len(clean["git_rev"]) == 40
    (tmp_path / "a.py").write_text("x = 2\n")
    edited = code_state(tmp_path)["uncommitted"]
    (tmp_path / "b.py").write_text("y\n")
    untracked = code_state(tmp_path)["uncommitted"]
    assert "clean" not in (edited, untracked) and edited != untracked
    assert code_state(tmp_path / "nowhere")["git_rev"] == "not a git checkout"


def test_data_digests_and_requirements(tmp_path: Path) -> None:
    (tmp_path / "dump" / "train" / "shards").mkdir(parents=True)
    (tmp_path / "dump" / "train" / "data.jsonl").write_text("a\n")
    shards = tmp_path / "dump" / "train" / "shards"
    before = shard_list_digest(shards)
    (shards / "f.ark").write_bytes(b"12")
    assert shard_list_digest(shards) != before and shard_list_digest(tmp_path / "none") == "absent"
    digests = data_digests(tmp_path / "data", tmp_path / "dump")
    assert set(digests) == {f"{tmp_path}/dump/train/data.jsonl", f"{shards}/ (listing)"}
    names = requirement_names(ROOT / "requirements.txt")
    assert {"torch", "funasr", "deepspeed", "tritonclient", "prometheus-client"} <= set(names)
    assert bus_factor(2) == 1.0 and bus_factor(8) == 1.75 and bus_factor(1) == 0.0


# ---- communication profiles --------------------------------------------------------------------------
def test_profiles_keep_what_the_user_set() -> None:
    variables = profile("ethernet", socket_ifname="eth1")
    names = [v.name for v in variables]
    assert {"NCCL_IB_DISABLE", "NCCL_SOCKET_IFNAME", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
            "DEEPSPEED_TIMEOUT"} <= set(names)
    assert all(v.why for v in variables)
    lines = exports(variables, {"NCCL_SOCKET_IFNAME": "bond0"})
    assert "export NCCL_IB_DISABLE=1" in lines and not any("NCCL_SOCKET_IFNAME" in line for line in lines)
    resolved = dict((v.name, applies) for v, applies in resolve(variables, {"NCCL_IB_DISABLE": "0"}))
    assert resolved["NCCL_IB_DISABLE"] is False
    assert {v.name: v.value for v in profile("infiniband")}["NCCL_IB_DISABLE"] == "0"
    debug = {v.name: v.value for v in profile("debug")}
    assert debug["NCCL_DEBUG"] == "INFO" and debug["TORCH_DISTRIBUTED_DEBUG"] == "DETAIL"
    assert "NCCL_SOCKET_IFNAME" not in {v.name for v in profile("default")}
    with pytest.raises(ValueError, match="--comm-profile"):
        profile("wifi")


def test_comm_env_prints_exports_and_the_values_in_force() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "TORCH_NCCL", "DEEPSPEED_"))}
    res = subprocess.run([sys.executable, "-m", "local.comm_env", "--profile", "debug"], cwd=ROOT, text=True,
                         capture_output=True, env={**env, "NCCL_DEBUG": "TRACE"}, check=True)
    assert "export NCCL_DEBUG_SUBSYS=INIT,NET,ENV" in res.stdout and "NCCL_DEBUG=" not in res.stdout
    assert "NCCL_DEBUG=TRACE  (yours, kept)" in res.stderr and "NCCL_ALGO=Ring  (profile:" in res.stderr


def test_a_missing_or_empty_file_on_one_node_is_a_difference(tmp_path: Path) -> None:
    """Bad input: node 1 lacks the config and has an empty data.jsonl where node 0 has real ones."""
    from funasr_recipe.dist.node_report import NodeInputs, node_report

    def inputs(root: Path) -> NodeInputs:
        return NodeInputs(root=root, config=Path("conf/x.yaml"), ds_config=Path("ds.json"),
                          data_dir=root / "data", dump_dir=root / "dump", exp_dir=root / "exp", options="")
    node0, node1 = tmp_path / "n0", tmp_path / "n1"
    for root in (node0, node1):
        (root / "conf").mkdir(parents=True)
        (root / "dump" / "train").mkdir(parents=True)
        (root / "ds.json").write_text("{}")
    (node0 / "conf" / "x.yaml").write_text("model: X\n")
    (node0 / "dump" / "train" / "data.jsonl").write_text('{"key": "a"}\n')
    (node1 / "dump" / "train" / "data.jsonl").write_text("")
    reports = [node_report(inputs(node0), "cpu", 1), node_report(inputs(node1), "cpu", 1)]
    # On a cluster both nodes name the data by the same path; here the roots differ, so map node 1's.
    reports[1]["agree"]["data"] = {k.replace(str(node1), str(node0)): v
                                   for k, v in reports[1]["agree"]["data"].items()}
    found = differences(reports)
    assert any("config conf/x.yaml sha256 absent differs" in d for d in found), found
    empty = "e3b0c44298fc.."  # sha256 of no bytes
    assert any(f"data.jsonl sha256 {empty} differs" in d for d in found), found
