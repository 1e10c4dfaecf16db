"""kit.background: pool threads lowered in priority and named, the calling thread untouched
(a nice value is per thread on Linux, sched(7))."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from kit.background import BACKGROUND_NICE, background_pool


def _own_nice_and_name() -> tuple[int, str]:
    tid = threading.get_native_id()
    name = Path(f"/proc/self/task/{tid}/comm").read_text().strip()
    return os.getpriority(os.PRIO_PROCESS, tid), name


def test_pool_threads_run_nicer_and_named_and_the_caller_is_untouched() -> None:
    before = _own_nice_and_name()
    pool = background_pool(2, "kura-test-bg")
    try:
        seen = {pool.submit(_own_nice_and_name).result(timeout=10) for _ in range(8)}
    finally:
        pool.shutdown(wait=True)
    assert seen == {(before[0] + BACKGROUND_NICE, "kura-test-bg")}, seen
    assert _own_nice_and_name() == before


def test_a_name_longer_than_the_kernel_keeps_is_cut_not_refused() -> None:
    pool = background_pool(1, "kura-a-very-long-thread-name")
    try:
        nice, name = pool.submit(_own_nice_and_name).result(timeout=10)
    finally:
        pool.shutdown(wait=True)
    assert name == "kura-a-very-lon"  # 15 characters, TASK_COMM_LEN 16 with the NUL
    assert nice == os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) + BACKGROUND_NICE
