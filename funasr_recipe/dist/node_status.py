"""What each node is doing during training, in the shared exp dir: a heartbeat while it runs, its outcome
when its torchrun ends. With them a node can tell a peer that was lost (killed, rebooted, unreachable)
from one that failed or is still running, and no node reports success while a peer left early.

torchrun alone does neither: a surviving node sees gloo's "Connection reset by peer" (or NCCL's
"remote process exited") naming no node, and a node whose peer's agent vanished at the end waits out
its 300 s exit barrier and then reports success.

Reads and writes, under ``nodes_dir`` (run.sh: exp/<tag>/.nodes):
  alive.node<N>    "<fingerprint> <host> <pid> <time>": rewritten every ``BEAT_S`` while node N trains;
  outcome.node<N>  "<fingerprint> ok|failed <host>": written when node N's torchrun has ended.

  heartbeat(Path("exp/x/.nodes"), fp, node_rank=1, parent=run_sh_pid)          # until run.sh is gone
  set_outcome(Path("exp/x/.nodes"), fp, node_rank=1, ok=True)
  wait_for_peers(Path("exp/x/.nodes"), fp, node_rank=0, nnodes=2, timeout=600)  # NodesFailed if not
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from funasr_recipe.core.files import write_atomic

BEAT_S = 2.0
# A node whose beat has not changed for this long is gone: several beats, so that a busy shared
# filesystem or a slow attribute cache is not taken for a lost node.
LOST_AFTER_S = 6 * BEAT_S


class NodesFailed(RuntimeError):
    """Some node failed or was lost; the message names each and says what to do."""


def _path(nodes_dir: Path, kind: str, node_rank: int) -> Path:
    return Path(nodes_dir) / f"{kind}.node{node_rank}"


def _read(path: Path, fp: str) -> list[str] | None:
    """The fields after the fingerprint, or None when the file is absent or from another run."""
    try:
        fields = path.read_text(encoding="utf-8").split()
    except FileNotFoundError:
        return None
    return fields[1:] if fields[:1] == [fp] else None


def start(nodes_dir: Path, node_rank: int) -> None:
    """Clear this node's outcome of an earlier run before it trains again."""
    Path(nodes_dir).mkdir(parents=True, exist_ok=True)
    _path(nodes_dir, "outcome", node_rank).unlink(missing_ok=True)


def heartbeat(nodes_dir: Path, fp: str, node_rank: int, parent: int, beats: int | None = None) -> None:
    """Rewrite alive.node<N> every BEAT_S while process ``parent`` (run.sh) lives; ``beats`` bounds it."""
    path, host, n = _path(nodes_dir, "alive", node_rank), socket.gethostname(), 0
    Path(nodes_dir).mkdir(parents=True, exist_ok=True)
    while _alive(parent) and (beats is None or n < beats):
        n += 1
        write_atomic(path, f"{fp} {host} {os.getpid()} {time.time():.6f}\n")
        time.sleep(BEAT_S)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process with that pid: ours is gone
        return False
    return True


def set_outcome(nodes_dir: Path, fp: str, node_rank: int, ok: bool) -> None:
    """Record how this node's training ended."""
    write_atomic(_path(nodes_dir, "outcome", node_rank),
                 f"{fp} {'ok' if ok else 'failed'} {socket.gethostname()}\n")


@dataclass
class PeerState:
    node: int
    host: str
    state: str  # ok | failed | running | lost | absent


def peer_states(nodes_dir: Path, fp: str, nnodes: int, node_rank: int, watch_s: float,
                poll: float = 0.5) -> list[PeerState]:
    """Every other node's state, watched for up to ``watch_s``: a beat that changes is ``running``, one
    that stays still for LOST_AFTER_S is ``lost``; an outcome file settles it at once."""
    peers = [n for n in range(nnodes) if n != node_rank]
    first = {n: _read(_path(nodes_dir, "alive", n), fp) for n in peers}
    since = {n: time.monotonic() for n in peers}
    states: dict[int, PeerState] = {}
    deadline = time.monotonic() + watch_s
    while True:
        for n in peers:
            if n in states and states[n].state != "running":
                continue
            outcome = _read(_path(nodes_dir, "outcome", n), fp)
            beat = _read(_path(nodes_dir, "alive", n), fp)
            host = outcome[1] if outcome else beat[0] if beat else "?"
            if outcome:
                states[n] = PeerState(n, host, outcome[0])
            elif beat is None:
                states[n] = PeerState(n, "?", "absent")
            elif beat != first[n]:
                states[n] = PeerState(n, host, "running")
            elif time.monotonic() - since[n] >= LOST_AFTER_S:
                states[n] = PeerState(n, host, "lost")
        unsettled = [n for n in peers if n not in states]
        if not unsettled or time.monotonic() >= deadline:
            for n in unsettled:  # still beating the same beat, not yet long enough to call it lost
                states[n] = PeerState(n, (first[n] or ["?"])[0], "running")
            return [states[n] for n in peers]
        time.sleep(poll)


def describe(states: list[PeerState], nodes_dir: Path) -> list[str]:
    """A line per node that is not fine, saying what happened and what to do."""
    lines = []
    for s in states:
        if s.state == "lost":
            lines.append(f"node {s.node} ({s.host}) was lost: its heartbeat in {nodes_dir} stopped without an "
                         "outcome (killed, out of host memory, rebooted or unreachable). Look at that machine; "
                         "then rerun the same command on every node: training resumes from the last checkpoint.")
        elif s.state == "failed":
            lines.append(f"node {s.node} ({s.host}) failed: its train.node{s.node}.log says why "
                         "(train.log for node 0).")
        elif s.state == "absent":
            lines.append(f"node {s.node} never started training (no heartbeat in {nodes_dir}).")
        elif s.state == "running":
            lines.append(f"node {s.node} ({s.host}) is still running.")
    return lines


def diagnose(nodes_dir: Path, fp: str, nnodes: int, node_rank: int, watch_s: float) -> list[str]:
    """After this node's torchrun failed: what the other nodes did (NodesFailed-style lines)."""
    return describe([s for s in peer_states(nodes_dir, fp, nnodes, node_rank, watch_s) if s.state != "ok"],
                     nodes_dir)


def wait_for_peers(nodes_dir: Path, fp: str, node_rank: int, nnodes: int, timeout: float,
                   poll: float = 1.0) -> None:
    """After this node's torchrun succeeded: wait until every node's outcome is ok; NodesFailed as soon as
    one failed or was lost, or when ``timeout`` runs out."""
    deadline = time.monotonic() + timeout
    while True:
        states = peer_states(nodes_dir, fp, nnodes, node_rank, watch_s=min(LOST_AFTER_S + 1, timeout))
        bad = [s for s in states if s.state in ("failed", "lost", "absent")]
        if bad or all(s.state == "ok" for s in states):
            break
        if time.monotonic() >= deadline:
            bad = [s for s in states if s.state != "ok"]
            break
        time.sleep(poll)
    if bad:
        raise NodesFailed("training ended here, but not on every node, so it is not done: "
                          + " ".join(describe(bad, nodes_dir)))
