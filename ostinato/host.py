"""What this host is, as both sides see it: the cores this process may use and the CPU's name."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask, e.g. under taskset or a container's cpuset)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def cpu_model() -> str:
    """The CPU's marketing name (/proc/cpuinfo), for measurement notes."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"
