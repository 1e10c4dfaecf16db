"""A process's descriptors, for tests that inject a descriptor shortage into a real process."""

from __future__ import annotations

import os
import resource


def descriptors(pid: int) -> int:
    """How many descriptors process ``pid`` holds (proc(5) ``/proc/PID/fd``)."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def squeeze(pid: int, hard: int) -> None:
    """Lower ``pid``'s soft descriptor limit to its lowest free descriptor number: it can open
    none (a new descriptor takes the lowest free number, EMFILE at or past the soft limit,
    Linux ``alloc_fd``) until one below it closes. Its count would not do: a transient
    descriptor numbered above the others closing (a request's file) frees a number below it."""
    used = {int(fd) for fd in os.listdir(f"/proc/{pid}/fd")}
    lowest_free = next(n for n in range(len(used) + 1) if n not in used)
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (lowest_free, hard))
