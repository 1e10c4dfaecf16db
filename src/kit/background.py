"""Threads for background bulk work (a bootstrap's hashing and writing, a scrub pass) that
yield the CPU to serving: each runs ``BACKGROUND_NICE`` steps nicer than the thread that
started the pool.

On Linux the nice value is a per-thread attribute (sched(7), "The nice value";
setpriority(2), "BUGS": ``PRIO_PROCESS`` with a thread ID applies to that thread only), so
the event loop and the request threads keep the process's priority while these threads get
a smaller share of a busy CPU. Raising one's own nice value needs no privilege. Elsewhere
(where ``PRIO_PROCESS`` would renice the whole process) and when the call is refused, the
threads run at normal priority: the work is the same, only its share of a contended CPU
differs.

Each thread also names itself in ``/proc/self/task/TID/comm`` (proc(5)), so ``top -H``,
``ps -L`` and a test can tell these threads from the others.

A bootstrap creates its staging files on these threads too: while other writes' fsyncs kept the
filesystem's journal busy, creating one took 44 to 96 ms on a joining node.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# 10 steps: at equal demand a nice-10 thread gets about 1/10 of the CPU time of a nice-0 one
# (the kernel's weights fall by about 1.25x per step).
BACKGROUND_NICE = 10
NICE_MAX = 19
COMM_MAX_CHARS = 15  # TASK_COMM_LEN 16, with the terminating NUL


def lower_this_thread(name: str, steps: int = BACKGROUND_NICE) -> None:
    """Make the calling thread ``steps`` nicer (at most 19) and name it ``name`` (first 15
    characters). Linux only; a no-op elsewhere. Never raises."""
    if not sys.platform.startswith("linux"):
        return
    tid = threading.get_native_id()
    with contextlib.suppress(OSError):
        current = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, min(NICE_MAX, current + steps))
    with contextlib.suppress(OSError):
        Path(f"/proc/self/task/{tid}/comm").write_text(name[:COMM_MAX_CHARS])


def background_pool(workers: int, name: str) -> ThreadPoolExecutor:
    """A pool of ``workers`` threads lowered by ``lower_this_thread(name)`` as each starts."""
    return ThreadPoolExecutor(
        workers, thread_name_prefix=name, initializer=lower_this_thread, initargs=(name,)
    )
