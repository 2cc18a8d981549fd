"""The preflight of a (multi-node) training run: one process per node meets node 0 over a TCPStore at
master_addr:master_port, before torchrun does, and the run stops here, naming the node and the
difference, when a node has other code, packages, config or data, cannot see node 0's files, or is
missing. Then every process training would start runs a collective bandwidth test.

Reads  what node_report.py reads; the master address (resolved first, in seconds: a name that does
       not resolve is named at once); node 0's token files in <exp>/.preflight/ and <dump>/.preflight/;
writes (node 0) <exp>/preflight.json: every node's report, the differences, warnings, bandwidth.

  ok = run_preflight(PreflightSetup(inputs, node_rank=0, nnodes=2, ...))
"""

from __future__ import annotations

import json
import logging
import secrets
import shutil
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from funasr_recipe.core.files import write_atomic
from funasr_recipe.core.rejections import BadInputError
from funasr_recipe.dist.bandwidth import RESULT_KEY, bandwidth_table, run_bandwidth
from funasr_recipe.dist.compare import differences, node_table, warnings
from funasr_recipe.dist.node_report import NodeInputs, node_report

log = logging.getLogger(__name__)
CLOCK_ROUNDS = 3
# Seconds the master address may take to resolve: glibc's resolver alone retries a dead DNS server for
# 10 s and more (resolv.conf's timeout x attempts), and torch retries a name that does not resolve
# until its rendezvous timeout, minutes, logging nothing but "gai error -2".
RESOLVE_TIMEOUT = 10.0
# getaddrinfo's answers that mean the name does not exist (a typo, a NodeName that is no host name)
# rather than that the resolver failed this time.
_NO_SUCH_NAME = {getattr(socket, n) for n in ("EAI_NONAME", "EAI_NODATA") if hasattr(socket, n)}


@dataclass(frozen=True)
class PreflightSetup:
    inputs: NodeInputs
    node_rank: int
    nnodes: int
    master_addr: str
    master_port: int
    nproc_per_node: int
    device: str               # cpu or cuda
    sizes_mib: tuple[int, ...]  # all-reduce sizes of the bandwidth test (empty: no test)
    timeout: float            # seconds to wait for the other nodes at each step


class PreflightFailed(RuntimeError):
    """The nodes disagree, or one is missing; the message names them."""


def resolve_master(addr: str, port: int, timeout: float = RESOLVE_TIMEOUT) -> list[str]:
    """The IP addresses ``addr`` resolves to here, within ``timeout`` seconds. BadInputError (exit 2)
    when the name does not exist; PreflightFailed (exit 1) when the resolver fails or takes too long."""
    answer: list = []

    def lookup() -> None:
        try:
            answer.append(socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM))
        except (OSError, UnicodeError) as e:  # socket.gaierror is an OSError
            answer.append(e)

    # A daemon thread: getaddrinfo cannot be interrupted, and a hung one must not keep the process.
    worker = threading.Thread(target=lookup, name="resolve-master", daemon=True)
    worker.start()
    worker.join(timeout)
    hint = ("give --master-addr an address every node resolves to node 0 (an IP address, or a name in "
            "DNS or /etc/hosts on every node); under Slurm, slurm/run.sbatch takes node 0's NodeAddr")
    if not answer:
        raise PreflightFailed(f"--master-addr {addr!r} did not resolve within {timeout:.0f}s on this "
                              f"node ({socket.gethostname()}): is DNS reachable? Or {hint}")
    if isinstance(answer[0], BaseException):
        e = answer[0]
        if isinstance(e, socket.gaierror) and e.errno in _NO_SUCH_NAME or isinstance(e, UnicodeError):
            raise BadInputError(f"--master-addr {addr!r} does not resolve on this node "
                                f"({socket.gethostname()}): {e}; {hint}")
        raise PreflightFailed(f"--master-addr {addr!r} could not be resolved on this node "
                              f"({socket.gethostname()}): {e}; {hint}")
    return sorted({info[4][0] for info in answer[0]})


def _is_local(ip: str) -> bool:
    """True if this machine has the address (a socket can be bound to it)."""
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.bind((ip, 0))
        return True
    except OSError:
        return False


def check_master(setup: PreflightSetup) -> list[str]:
    """Resolve the master address before anything waits on it; on node 0, warn when none of its
    addresses is this machine's (the other nodes would look for node 0 elsewhere)."""
    ips = resolve_master(setup.master_addr, setup.master_port)
    log.info("preflight: --master-addr %s resolves to %s", setup.master_addr, ", ".join(ips))
    if setup.node_rank == 0 and not any(_is_local(ip) for ip in ips):
        log.warning("preflight: --master-addr %s resolves to %s, none of which is an address of this "
                    "machine (%s, node 0): the other nodes will look for node 0 there", setup.master_addr,
                    ", ".join(ips), socket.gethostname())
    return ips


def _store(setup: PreflightSetup):
    import torch.distributed as dist

    try:
        return dist.TCPStore(setup.master_addr, setup.master_port, is_master=setup.node_rank == 0,
                             timeout=timedelta(seconds=setup.timeout), wait_for_workers=False)
    except (RuntimeError, OSError) as e:
        where = f"{setup.master_addr}:{setup.master_port}"
        if setup.node_rank == 0:
            raise PreflightFailed(f"node 0 cannot listen on {where} ({e}): is the port in use (another job, "
                                  "a previous run still exiting)? Choose another --master-port") from e
        raise PreflightFailed(f"node {setup.node_rank} could not reach node 0 at {where} within "
                              f"{setup.timeout:.0f}s ({e}): is run.sh running on node 0 with the same "
                              "--master-addr/--master-port, and is the port open between the nodes?") from e


def _wait(store, keys: list[str], what: str, timeout: float,
          message: Callable[[list[str]], str] | None = None) -> None:
    """Block until every key is set; on timeout PreflightFailed with ``message(the missing keys)``."""
    try:
        store.wait(keys, timedelta(seconds=timeout))
    except RuntimeError as e:  # torch raises a DistStoreError (a RuntimeError) on timeout
        missing = [k for k in keys if not store.check([k])]
        text = (message(missing) if message
                else f"after {timeout:.0f}s still waiting for {what}: {', '.join(missing)}")
        raise PreflightFailed(text) from e


def _wait_for_nodes(store, setup: PreflightSetup) -> None:
    """Node 0 waits for every node to say hello; names the missing ones as the check-in does."""
    def message(missing: list[str]) -> str:
        ranks = " ".join(k.split("/")[1] for k in missing)
        return (f"after {setup.timeout:.0f}s node(s) {ranks} of {setup.nnodes} have not arrived at the "
                f"preflight on {setup.master_addr}:{setup.master_port}. Start the same command on them "
                f"(--node-rank {ranks}); if they are running, check that they reach this address and port "
                "(firewall, --master-addr)")

    _wait(store, [f"hello/{r}" for r in range(setup.nnodes)], "the nodes", setup.timeout, message)


def _token_dirs(inputs: NodeInputs) -> dict[str, Path]:
    """Where node 0 puts its token, in each dir that must be shared."""
    return {"exp": inputs.exp_dir / ".preflight", "dump": inputs.dump_dir / ".preflight"}


def _token_paths(inputs: NodeInputs, token: str) -> dict[str, Path]:
    # A new name each run: an NFS client may cache that an old name does not exist.
    return {name: d / token for name, d in _token_dirs(inputs).items()}


def _read_token(path: Path, token: str, patience: float = 10.0) -> str:
    """"ok", or why node 0's token is not readable here (after a few seconds: NFS attribute caches)."""
    deadline = time.monotonic() + patience
    while True:
        try:
            held = path.read_text(encoding="utf-8").strip()
            return "ok" if held == token else f"different: {path} holds {held[:12]!r}, not node 0's token"
        except FileNotFoundError:
            status = f"missing: node 0's token {path} is not there"
        except OSError as e:
            status = f"unreadable: {path}: {e}"
        if time.monotonic() > deadline:
            return status
        time.sleep(1.0)


def _check_shared(inputs: NodeInputs, token: str) -> dict[str, dict[str, str]]:
    """Read back node 0's token in each dir that must be shared."""
    return {name: {"path": str(path.parent.parent.resolve()), "status": _read_token(path, token)}
            for name, path in _token_paths(inputs, token).items()}


def _clock_client(store, rank: int) -> dict[str, float]:
    """NTP's estimate against node 0 from the round trip with the least delay: offset = node 0's time -
    the midpoint of ours; its error is at most half that round trip."""
    best = None
    for i in range(CLOCK_ROUNDS):
        t1 = time.time()
        store.set(f"clock/{rank}/{i}/ask", str(t1))
        node0 = float(store.get(f"clock/{rank}/{i}/answer"))
        t2 = time.time()
        if best is None or t2 - t1 < best[0]:
            best = (t2 - t1, node0 - (t1 + t2) / 2)
    return {"offset_s": round(-best[1], 4), "error_s": round(best[0] / 2, 4)}


def _clock_server(store, nnodes: int, timeout: float) -> None:
    for rank in range(1, nnodes):
        for i in range(CLOCK_ROUNDS):
            _wait(store, [f"clock/{rank}/{i}/ask"], f"node {rank}'s clock", timeout)
            store.set(f"clock/{rank}/{i}/answer", str(time.time()))


def _exchange(setup: PreflightSetup, store) -> tuple[list[dict] | None, dict]:
    """Every node's report to node 0 (node 0 gets the list; the others None) and node 0's verdict."""
    rank, n = setup.node_rank, setup.nnodes
    store.set(f"hello/{rank}", socket.gethostname())
    report = node_report(setup.inputs, setup.device, setup.nproc_per_node)
    if rank == 0:
        _wait_for_nodes(store, setup)
        token = secrets.token_hex(16)
        for path in _token_paths(setup.inputs, token).values():
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, token + "\n")
        store.set("token", token)
        _clock_server(store, n, setup.timeout)
        report["shared"], report["clock"] = {}, None
        _wait(store, [f"report/{r}" for r in range(1, n)], "the nodes' reports", setup.timeout)
        reports = [report] + [json.loads(store.get(f"report/{r}")) for r in range(1, n)]
        verdict = {"differences": differences(reports), "warnings": warnings(reports),
                   "table": node_table(reports)}
        store.set("verdict", json.dumps(verdict))
        return reports, verdict
    _wait(store, ["token"], "node 0's token", setup.timeout)
    report["shared"] = _check_shared(setup.inputs, store.get("token").decode())
    report["clock"] = _clock_client(store, rank)
    store.set(f"report/{rank}", json.dumps(report))
    _wait(store, ["verdict"], "node 0's verdict", setup.timeout)
    return None, json.loads(store.get("verdict"))


def _bandwidth(setup: PreflightSetup, store) -> dict | None:
    """The collective test (every node's processes); the result, or None when there is nothing to test."""
    if not setup.sizes_mib or setup.nnodes * setup.nproc_per_node < 2:
        log.info("bandwidth test skipped: %s", "no sizes given" if not setup.sizes_mib else "one process")
        return None
    log.info("all-reduce bandwidth test: %d node(s) x %d %s process(es), sizes %s MiB", setup.nnodes,
             setup.nproc_per_node, setup.device, ",".join(map(str, setup.sizes_mib)))
    run_bandwidth(setup.node_rank, setup.nproc_per_node, setup.nnodes, setup.master_addr,
                  setup.master_port, setup.device, list(setup.sizes_mib), setup.timeout)
    # Global rank 0 set it before the workers' last barrier: every node can read it now.
    return json.loads(store.get(RESULT_KEY))


def run_preflight(setup: PreflightSetup) -> dict:
    """Run this node's part; returns node 0's verdict (with "ok"); raises PreflightFailed when the nodes
    disagree or one is missing, on every node alike (BadInputError: --master-addr does not resolve)."""
    check_master(setup)
    store = _store(setup)
    reports, verdict = _exchange(setup, store)
    for line in verdict["table"]:
        log.info("preflight | %s", line)
    for line in verdict["warnings"]:
        log.warning("preflight: %s", line)
    verdict["ok"] = not verdict["differences"]
    bandwidth = _bandwidth(setup, store) if verdict["ok"] else None
    if bandwidth is not None:
        for line in bandwidth_table(bandwidth):
            log.info("preflight | %s", line)
    if setup.node_rank == 0:
        out = setup.inputs.exp_dir / "preflight.json"
        write_atomic(out, json.dumps({**verdict, "nodes": reports, "bandwidth": bandwidth}, indent=1) + "\n")
        log.info("preflight: %s", out)
        # Node 0's store must outlive the others' last reads.
        store.set("done/0", "1")
        _wait(store, [f"done/{r}" for r in range(1, setup.nnodes)], "the nodes to finish", setup.timeout)
        for d in _token_dirs(setup.inputs).values():
            shutil.rmtree(d, ignore_errors=True)
    else:
        store.set(f"done/{setup.node_rank}", "1")
    if not verdict["ok"]:
        raise PreflightFailed(f"{len(verdict['differences'])} difference(s) between the nodes:\n  "
                              + "\n  ".join(verdict["differences"]))
    return verdict
