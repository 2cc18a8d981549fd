"""Why stage 2 failed on this node, in words: the other nodes' state (dist/node_status.py) and what the
training log's last lines point at. run.sh prints these lines after a failed torchrun.

Reads  the node status files under the nodes dir and the node's training log; writes nothing.

  for line in explain(Path("exp/x/.nodes"), fp, nnodes=2, node_rank=0, log=Path("exp/x/train.log"),
                      master="10.0.0.1:29500", watch_s=15): print(line)
"""

from __future__ import annotations

import re
from pathlib import Path

from funasr_recipe.dist.node_status import diagnose

TAIL_BYTES = 1 << 20  # this run's failure is at the end of an appended log
# What a collective or the rendezvous says when a peer's processes are gone (gloo, NCCL, the store).
PEER_GONE = re.compile(r"Connection reset by peer|Connection closed by peer|remote process exited|"
                       r"Broken pipe|NCCL communicator was aborted|ProcessGroupGloo.*(?:closed|reset)", re.I)
NO_RENDEZVOUS = re.compile(r"timed out|timeout|Connection refused|rendezvous", re.I)


def _tail(log: Path) -> str:
    try:
        with open(log, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - TAIL_BYTES))
            return f.read().decode("utf-8", "replace")
    except FileNotFoundError:
        return ""


def explain(nodes_dir: Path, fp: str, nnodes: int, node_rank: int, log: Path, master: str,
            watch_s: float) -> list[str]:
    """Lines for the user: which peers were lost or failed, then what the log's tail points at."""
    text = _tail(log)
    lines = diagnose(nodes_dir, fp, nnodes, node_rank, watch_s) if nnodes > 1 else []
    if "TrainingDiverged" in text:
        lines.append("Training diverged: the 'bad step' lines above name the steps and utterance keys, and the "
                     "advice names the overrides to try (a lower ++optim_conf.lr, a longer warmup).")
    if "OutOfMemoryPlan" in text:
        lines.append("The largest batch of the first epoch does not fit in memory: see 'To fit:' above.")
    if PEER_GONE.search(text) and not any("was lost" in line or "failed" in line for line in lines):
        lines.append("A collective lost its connection to a peer; the other nodes' logs say which stopped first.")
    elif NO_RENDEZVOUS.search(text) and not lines:
        lines.append(f"The ranks did not all meet at {master}: are all {nnodes} nodes running this command "
                     "with the same --nnodes/--master-addr/--master-port, and can they reach node 0 "
                     "(firewall, NCCL_SOCKET_IFNAME)?")
    return lines
