"""What this process may use of the machine."""

from __future__ import annotations

import os


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity mask (``taskset -c 0,1`` on a bigger machine gives 2),
    not ``os.cpu_count()``, which counts the whole machine and would oversubscribe the pinned cores."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
