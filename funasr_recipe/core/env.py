"""What a result was measured on: the cores this process may use, the CPU, package versions; and the
recipe's environment (path.sh's) for a program that starts the recipe's processes itself."""

from __future__ import annotations

import os
import platform
import subprocess
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path


def available_cores() -> int:
    """The cores this process may run on (taskset and cpusets count; os.cpu_count() sees every core)."""
    return len(os.sched_getaffinity(0))


def versions(*packages: str) -> dict[str, str]:
    """Installed version of each package ("-" when absent), from package metadata: importing torch only
    to print its version would take seconds."""
    out = {}
    for package in packages:
        try:
            out[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            out[package] = "-"
    return out


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), else what platform knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def recipe_env(root: Path, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment path.sh makes from ``base`` (default: this process's): the venv's bin first on PATH
    (ninja, for DeepSpeed's op builds), the repository on PYTHONPATH, one thread per process, DeepSpeed's
    build dir of this venv. For a program that starts training processes itself (``bench.bench_train``
    under ``.venv/bin/python``, without ``. ./path.sh``): run.sh sources path.sh, a benchmark must not
    measure under other settings. path.sh stays the one place they are set."""
    out = subprocess.run(["bash", "-c", '. ./path.sh >&2 && env -0'], cwd=root, capture_output=True,
                         check=True, env=dict(os.environ if base is None else base)).stdout
    return dict(item.split("=", 1) for item in out.decode().split("\0") if "=" in item)
