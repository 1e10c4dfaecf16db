"""The CPUs this process may use: what ``auto`` worker counts should be sized by.

``os.cpu_count()`` counts the machine's CPUs, which overstates a container's share. This takes
the smaller of the scheduler affinity mask (sched_getaffinity(2): ``taskset``, cpusets) and a
cgroup v2 CPU quota (``cpu.max``: ``$QUOTA $PERIOD`` or ``max $PERIOD``, cgroups(7)), rounded
up, as Go's and the JVM's container-aware defaults do. At least 1.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def _own_cgroup() -> Path | None:
    """The cgroup v2 directory of this process, from /proc/self/cgroup (``0::/path``)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("0::"):
            return CGROUP_ROOT / line[3:].lstrip("/")
    return None


def quota_cpus(cgroup: Path | None) -> float | None:
    """The tightest ``cpu.max`` quota from ``cgroup`` up to the root, in CPUs; None if none."""
    tightest = None
    while cgroup is not None:
        try:
            quota, period = (cgroup / "cpu.max").read_text().split()
        except (OSError, ValueError):
            quota = "max"
            period = "1"
        if quota != "max" and int(period) > 0:
            cpus = int(quota) / int(period)
            tightest = cpus if tightest is None else min(tightest, cpus)
        if cgroup == CGROUP_ROOT or cgroup.parent == cgroup:
            break
        cgroup = cgroup.parent
    return tightest


def available_cpus() -> int:
    """CPUs usable by this process (module docstring); at least 1."""
    try:
        count = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        count = os.cpu_count() or 1
    quota = quota_cpus(_own_cgroup())
    if quota is not None:
        count = min(count, math.ceil(quota))
    return max(1, count)
