"""Node check-in before a collective start: every node must see every other's file in a shared dir.

torchrun alone would wait for missing ranks and then time out without saying which node is missing or
that the directory is not shared; here each node writes ``<dir>/node<rank>`` holding the run's
fingerprint and its host name, then waits until all ``nnodes`` files hold the same fingerprint.

  check_in(Path("exp/x/.nodes"), fp, node_rank=1, nnodes=4, timeout=7200)
"""

from __future__ import annotations

import socket
from pathlib import Path

from funasr_recipe.core.files import write_atomic
from funasr_recipe.dist.markers import wait_until


def node_file(nodes_dir: Path, node_rank: int) -> Path:
    """The check-in file of one node."""
    return Path(nodes_dir) / f"node{node_rank}"


def check_in(nodes_dir: Path, fp: str, node_rank: int, nnodes: int, timeout: float, poll: float = 2.0) -> None:
    """Write this node's check-in, then wait for every node's; TimeoutError names the missing ones."""
    nodes_dir = Path(nodes_dir)
    nodes_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(node_file(nodes_dir, node_rank), f"{fp} {socket.gethostname()}\n")

    def missing() -> list[str]:
        out = []
        for n in range(nnodes):
            try:
                held = node_file(nodes_dir, n).read_text(encoding="utf-8").split()[:1]
            except FileNotFoundError:
                held = []
            if held != [fp]:
                out.append(f"node {n}")
        return out

    def message(left: list[str]) -> str:
        ranks = " ".join(m.split()[1] for m in left)
        return (f"after {timeout:.0f}s node(s) {ranks} of {nnodes} have not arrived in {nodes_dir}. Start the "
                f"same command on them (--node-rank {ranks}); if they are running, {nodes_dir} is not on a "
                "filesystem they share with this node.")

    wait_until(missing, f"waiting for {nnodes} nodes to check in under {nodes_dir}", timeout, message, poll)
