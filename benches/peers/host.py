"""The machine a benchmark runs on, in one line for a results file."""

from __future__ import annotations

import os
import platform
import re
from pathlib import Path


def filesystem_of(path: Path) -> str:
    """The type of the file system holding ``path`` (longest mount point
    that prefixes it in /proc/mounts), or ``"?"``."""
    best, fs = "", "?"
    target = str(path.resolve())
    for line in Path("/proc/mounts").read_text().splitlines():
        parts = line.split()
        if target.startswith(parts[1]) and len(parts[1]) > len(best):
            best, fs = parts[1], parts[2]
    return fs


def describe_machine(data: Path) -> str:
    """``"2 CPUs (model), 24 GiB, Linux <release>, data on <fs>"``."""
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    meminfo = Path("/proc/meminfo").read_text()
    mem = int(re.search(r"MemTotal:\s+(\d+)", meminfo).group(1)) / 2**20
    return (
        f"{os.cpu_count()} CPUs ({cpu}), {mem:.0f} GiB, Linux {platform.release()}, "
        f"data on {filesystem_of(data)}"
    )
