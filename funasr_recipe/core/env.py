"""What a result was measured on: the cores this process may use, the CPU, package versions."""

from __future__ import annotations

import os
import platform
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
