"""The preflight's verdict from every node's report: what differs from node 0 (fatal), what looks wrong
but may be intended (warnings), and the one table the log shows.

Reads and writes nothing: reports in (funasr_recipe/dist/node_report.py, plus "shared" and "clock"
added by the exchange), lines out.

  problems = differences(reports); table = node_table(reports)
"""

from __future__ import annotations

import hashlib
import shlex

CLOCK_WARN_S = 2.0        # log lines and markers of different nodes stop lining up
DISK_WARN_GIB = 20.0      # a few checkpoints of a SenseVoiceSmall-sized model and their optimizer states
GPU_BUSY_FRACTION = 0.1   # memory already taken on a GPU before training: another job is on it


def short(digest: str) -> str:
    return digest if len(digest) < 40 else f"{digest[:12]}.."


def _options_difference(mine: str, ref: str) -> str:
    a, b = shlex.split(mine), shlex.split(ref)
    only_mine = [t for t in a if t not in b]
    only_ref = [t for t in b if t not in a]
    return (f"has {' '.join(only_mine) or '(nothing more)'} "
            f"where node 0 has {' '.join(only_ref) or '(nothing)'}")


def differences(reports: list[dict]) -> list[str]:
    """One line per thing a node has that node 0 has not, naming the node and both values."""
    ref = reports[0]["agree"]
    out = []
    for rank, report in enumerate(reports[1:], start=1):
        mine, node = report["agree"], f"node {rank} ({report['host']})"
        if mine["code"]["git_rev"] != ref["code"]["git_rev"]:
            out.append(f"{node}: git revision {short(mine['code']['git_rev'])} differs from node 0's "
                       f"{short(ref['code']['git_rev'])}")
        if mine["code"]["uncommitted"] != ref["code"]["uncommitted"]:
            out.append(f"{node}: uncommitted changes (sha256 {short(mine['code']['uncommitted'])}) "
                       f"differ from node 0's ({short(ref['code']['uncommitted'])})")
        for package in sorted(set(mine["versions"]) | set(ref["versions"])):
            a, b = mine["versions"].get(package, "-"), ref["versions"].get(package, "-")
            if a != b:
                out.append(f"{node}: {package} {a} differs from node 0's {b}")
        for role in sorted(set(mine["files"]) | set(ref["files"])):
            a, b = mine["files"].get(role, {}), ref["files"].get(role, {})
            if a != b:
                out.append(f"{node}: {role} {a.get('path')} sha256 {short(a.get('sha256', '-'))} "
                           f"differs from node 0's {b.get('path')} {short(b.get('sha256', '-'))}")
        for path in sorted(set(mine["data"]) | set(ref["data"])):
            a, b = mine["data"].get(path, "absent"), ref["data"].get(path, "absent")
            if a != b:
                out.append(f"{node}: {path} sha256 {short(a)} differs from node 0's {short(b)}")
        if mine["options"] != ref["options"]:
            diff = _options_difference(mine["options"], ref["options"])
            out.append(f"{node}: run.sh options differ: it {diff}")
        for name, seen in report.get("shared", {}).items():
            if seen["status"] != "ok":
                out.append(f"{node}: {name} dir {seen['path']} is not shared with node 0: {seen['status']} "
                           f"(put data/, dump/ and exp/ on a filesystem every node mounts at the same path)")
    return out


def warnings(reports: list[dict]) -> list[str]:
    """Things that do not stop the run but usually cost it: clock skew, little disk, GPUs in use."""
    out = []
    for rank, report in enumerate(reports):
        node, res = f"node {rank} ({report['host']})", report["resources"]
        clock = report.get("clock")
        if clock and abs(clock["offset_s"]) > CLOCK_WARN_S:
            out.append(f"{node}: clock is {clock['offset_s']:+.1f} s off node 0's (run NTP/chrony)")
        for where, free in res["free_gib"].items():
            if free is not None and free < DISK_WARN_GIB:
                out.append(f"{node}: only {free:.1f} GiB free for {where}/")
        for gpu in res["gpus"]:
            used = gpu["total_gib"] - gpu["free_gib"]
            if used > GPU_BUSY_FRACTION * gpu["total_gib"]:
                out.append(f"{node}: GPU {gpu['index']} already has {used:.1f} of {gpu['total_gib']:.1f} GiB "
                           "in use (another process on it?)")
    return out


def _devices(res: dict) -> str:
    if res["gpus"]:
        names = sorted({g["name"] for g in res["gpus"]})
        free = min(g["free_gib"] for g in res["gpus"])
        total = min(g["total_gib"] for g in res["gpus"])
        return f"{len(res['gpus'])}x {'/'.join(names)} ({free:.0f}/{total:.0f} GiB free)"
    cpu = res["cpu"]
    return (f"{res['processes']} CPU procs on {cpu['cores']} cores, "
            f"{cpu['mem_available_gib']:.0f}/{cpu['mem_total_gib']:.0f} GiB free")


def node_table(reports: list[dict]) -> list[str]:
    """One row per node: host, code, config, data, devices, disk, clock, shared dirs."""
    header = ("node", "host", "git rev", "uncommitted", "config sha256", "data sha256", "devices",
              "free exp/dump GiB", "clock s", "shared")
    rows = [header]
    for rank, r in enumerate(reports):
        agree, res = r["agree"], r["resources"]
        data = "-"
        if agree["data"]:
            data = hashlib.sha256("".join(f"{k}={v}\n" for k, v in sorted(agree["data"].items())).encode()
                                  ).hexdigest()[:12]
        clock = r.get("clock")
        shared = r.get("shared", {})
        rows.append((str(rank), r["host"], agree["code"]["git_rev"][:10], agree["code"]["uncommitted"][:10],
                     agree["files"]["config"]["sha256"][:12], data, _devices(res),
                     "/".join("-" if v is None else f"{v:.0f}" for v in res["free_gib"].values()),
                     "0 (ref)" if rank == 0 else (f"{clock['offset_s']:+.3f}" if clock else "-"),
                     "ref" if rank == 0
                     else ",".join(f"{k}:{v['status'].split(':')[0]}" for k, v in shared.items())))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
