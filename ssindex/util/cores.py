"""The CPU cores this process may run on."""

from __future__ import annotations

import os


def usable_cores() -> int:
    """Cores in this process's affinity mask (a container's or ``taskset``'s share),
    else every core the machine has."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1
