"""What one node tells the others in the preflight: the code, packages, files and data it would train
with (which must agree across nodes), and its resources (which are reported).

Reads  the recipe's git tree (its code, not what the recipe writes there: RECIPE_OUTPUTS),
       requirements.txt, the config and DeepSpeed files, every <set>/data.jsonl under data/ and dump/
       and the list of dump/<set>/shards/; writes nothing.

  report = node_report(NodeInputs(root=Path("."), config=Path("conf/x.yaml"), ...), device="cuda")
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

from funasr_recipe.core.env import available_cores, cpu_name, versions
from funasr_recipe.core.files import sha256_file

# Always compared, whatever requirements.txt says: a mismatch in any of these changes the numerics or
# the wire format of the collectives.
CORE_PACKAGES = ("torch", "torchaudio", "funasr", "deepspeed")
GIB = 1024 ** 3


@dataclass(frozen=True)
class NodeInputs:
    """Paths and options of one node's run, as run.sh resolved them on that node."""

    root: Path        # the recipe's checkout
    config: Path
    ds_config: Path
    data_dir: Path
    dump_dir: Path
    exp_dir: Path
    options: str      # run.sh's options but --node-rank, and the trainer overrides


def digest(path: Path) -> str:
    """Hex sha256 of a file's bytes, or "absent"."""
    return sha256_file(path) if path.is_file() else "absent"


def _git(root: Path, *args: str) -> bytes | None:
    try:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, check=True,
                              timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None


# What the recipe itself writes inside the checkout, which changes while the nodes compare their code
# (a job's log grows as it runs): the Slurm logs (slurm/run.sbatch's logs/, sbatch's default
# slurm-<job>.out), the default stage dirs (whose replay.sh scripts are under exp/), the venv and
# Python's caches. .gitignore lists most of them, but a checkout's own ignore rules may not.
RECIPE_OUTPUTS = ("logs", "exp", "data", "dump", ".venv", "slurm-*.out", "**/__pycache__", "**/*.pyc")


def _excludes(root: Path, outputs: tuple[Path, ...]) -> list[str]:
    """Git pathspecs that leave out RECIPE_OUTPUTS and the run's own dirs inside the checkout."""
    specs = [f":(exclude,glob){p}" for p in RECIPE_OUTPUTS]
    top = root.resolve()
    for out in outputs:
        path = (out if out.is_absolute() else root / out).resolve()
        if path != top and path.is_relative_to(top):
            specs.append(f":(exclude,literal){path.relative_to(top)}")
    return specs


def code_state(root: Path, outputs: tuple[Path, ...] = ()) -> dict[str, str]:
    """The checkout's revision and a hash of its uncommitted changes ("clean" when there are none):
    tracked edits (git diff HEAD) and, by content, untracked files that git does not ignore, but for
    what the recipe writes there (RECIPE_OUTPUTS and ``outputs``, the run's data, dump and exp dirs
    when they are inside the checkout): only code and config that a node could run differently."""
    rev = _git(root, "rev-parse", "HEAD")
    if rev is None:
        return {"git_rev": "not a git checkout", "uncommitted": "unknown"}
    excludes = _excludes(root, outputs)
    diff = _git(root, "diff", "HEAD", "--binary", "--", ".", *excludes) or b""
    untracked = (_git(root, "ls-files", "--others", "--exclude-standard", "-z", "--", ".", *excludes)
                 or b"").split(b"\0")
    h = hashlib.sha256(diff)
    for name in sorted(n for n in untracked if n):
        h.update(name + b"\0" + digest(root / name.decode("utf-8", "replace")).encode())
    dirty = bool(diff) or any(untracked)
    return {"git_rev": rev.decode().strip(), "uncommitted": h.hexdigest() if dirty else "clean"}


def requirement_names(requirements: Path) -> list[str]:
    """Package names pinned in requirements.txt (extras and comments dropped)."""
    names = []
    if requirements.is_file():
        for line in requirements.read_text(encoding="utf-8").splitlines():
            if m := re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?\s*==", line):
                names.append(m.group(1))
    return names


def package_versions(root: Path) -> dict[str, str]:
    """Python's version and the installed version of every pinned package ("-" when absent)."""
    names = list(dict.fromkeys([*CORE_PACKAGES, *requirement_names(root / "requirements.txt")]))
    return {"python": platform.python_version(), **versions(*names)}


def shard_list_digest(shards: Path) -> str:
    """A digest of a shard dir's listing (names and sizes, not the bytes: shards are large), or
    "absent"."""
    if not shards.is_dir():
        return "absent"
    h = hashlib.sha256()
    for p in sorted(shards.iterdir()):
        if p.is_file():
            h.update(f"{p.name}\t{p.stat().st_size}\n".encode())
    return h.hexdigest()


def data_digests(data_dir: Path, dump_dir: Path) -> dict[str, str]:
    """Every set's data.jsonl under data/ and dump/ by content, and dump/<set>/shards by listing; keyed
    by the path as given (the same on every node when run.sh runs with the same options)."""
    out = {}
    for base in (data_dir, dump_dir):
        for jsonl in sorted(base.glob("*/data.jsonl")):
            out[str(jsonl)] = digest(jsonl)
    for shards in sorted(dump_dir.glob("*/shards")):
        out[f"{shards}/ (listing)"] = shard_list_digest(shards)
    return out


def _meminfo() -> dict[str, float]:
    out = {}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, value = line.split(":", 1)
            if key in ("MemTotal", "MemAvailable"):
                out[key] = int(value.split()[0]) * 1024 / GIB
    except (OSError, ValueError):
        pass
    return out


def accelerators(device: str) -> list[dict[str, object]]:
    """Each visible GPU's model, total and free memory (GiB); empty on a CPU run."""
    if device != "cuda":
        return []
    import torch

    out = []
    for i in range(torch.cuda.device_count()):
        free, total = torch.cuda.mem_get_info(i)
        out.append({"index": i, "name": torch.cuda.get_device_name(i), "total_gib": round(total / GIB, 2),
                    "free_gib": round(free / GIB, 2)})
    return out


def free_gib(path: Path) -> float | None:
    """Free space (GiB) on the filesystem holding path (its nearest existing parent)."""
    path = Path(path).resolve()
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return round(shutil.disk_usage(path).free / GIB, 2)
    except OSError:
        return None


def node_report(inputs: NodeInputs, device: str, nproc_per_node: int) -> dict[str, object]:
    """This node's part of the preflight: what must agree ("agree") and what is only reported."""
    root = inputs.root
    files = {role: {"path": str(path), "sha256": digest(path if path.is_absolute() else root / path)}
             for role, path in (("config", inputs.config), ("ds_config", inputs.ds_config))}
    mem = _meminfo()
    return {
        "host": socket.gethostname(),
        "agree": {
            "code": code_state(root, (inputs.data_dir, inputs.dump_dir, inputs.exp_dir)),
            "versions": package_versions(root),
            "files": files,
            "data": data_digests(inputs.data_dir, inputs.dump_dir),
            "options": inputs.options,
        },
        "resources": {
            "device": device,
            "processes": nproc_per_node,
            "gpus": accelerators(device),
            "cpu": {"name": cpu_name(), "cores": available_cores(), "os_cpus": os.cpu_count(),
                    "mem_total_gib": round(mem.get("MemTotal", 0), 1),
                    "mem_available_gib": round(mem.get("MemAvailable", 0), 1)},
            "free_gib": {"exp": free_gib(inputs.exp_dir), "dump": free_gib(inputs.dump_dir)},
        },
    }
