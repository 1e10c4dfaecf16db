"""One-owner file locks: an exclusive flock(2) taken without waiting, and who holds one.

A lock held by another process raises ``Held`` naming that process's pid when Linux tells
(``/proc/locks``, proc(5)), so a refusal can say which process to stop.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

PROC_LOCKS = Path("/proc/locks")


class Held(Exception):
    """Another open file description holds the lock; ``pid`` is its process when known."""

    def __init__(self, path: Path, pid: int | None) -> None:
        super().__init__(f"{path} is locked by " + (f"pid {pid}" if pid else "another process"))
        self.pid = pid


def exclusive(path: Path) -> int:
    """Open ``path`` (created with mode 0644 if missing) and take an exclusive flock on it at
    once. Returns the descriptor, which holds the lock until it is closed (or the process
    exits). Raises ``Held`` if another holds it (the file is left as it was), OSError if the
    file cannot be opened."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = holder(os.fstat(fd))
        os.close(fd)
        raise Held(path, pid) from None
    return fd


def holder(st: os.stat_result, locks: Path = PROC_LOCKS) -> int | None:
    """The pid holding an flock on the file ``st`` describes, from ``/proc/locks`` (lines
    ``N: FLOCK ADVISORY WRITE PID MAJOR:MINOR:INODE START END``, device numbers in hex; waiters
    are marked ``->`` and skipped). None when unknown: not Linux, no such line, or a holder
    outside this process's pid namespace (shown as 0). Reads only."""
    device = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        text = locks.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == device:
            pid = int(fields[4])
            return pid if pid > 0 else None
    return None
