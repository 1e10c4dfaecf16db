"""Give the C allocator's freed memory back to the system, without slowing every large buffer.

glibc serves a block of at least ``M_MMAP_THRESHOLD`` bytes with its own ``mmap`` and unmaps it
on ``free``; the threshold starts at 128 KiB and rises to the size of each such block freed, up
to 32 MiB (mallopt(3), "M_MMAP_THRESHOLD"). After the first 1 MiB message buffer is freed, every
later one comes from the heap or a thread's arena, and memory freed there mostly stays with the
process: after 200 stalled gRPC Reads were cut, 590 MB of their message buffers stayed resident
(issue 26).

Fixing the threshold at 128 KiB returned that memory, but made every large buffer an ``mmap``,
256 page faults per MiB as its pages are first touched, and a ``munmap``: a ByteStream Read of a
64 MiB blob ran at 150 to 200 MiB/s instead of 900 (a bare grpc.aio server streaming 1 MiB
messages, 196 against 894 MiB/s). So the threshold keeps glibc's dynamic default and
``Trimmer`` returns the memory instead: once a second it asks glibc how many bytes its arenas
hold free (``mallinfo2``, glibc 2.33) and, when that is at least ``TRIM_FREE_BYTES``, calls
``malloc_trim(0)``, which since glibc 2.8 releases the whole free pages of every arena, not only
the top of the main heap (malloc_trim(3)), and only when that count also rose by
``TRIM_RISE_BYTES`` since its lowest point since the last trim: bytes freed since then, whose
pages are resident. (A trim
leaves the chunks it released on glibc's free lists, so the count alone would ask for a trim
every second; and the resident set alone misses what is freed after a trim made at its peak.)
``start_trimming`` runs ``trim_if_worth_it`` in one daemon thread per process, however many
nodes the process holds (a test process holds many).

A trim holds each arena's lock while it releases that arena's pages, and ``mallinfo2`` holds
it while it counts the free chunks, so a thread allocating from that arena meanwhile waits.
Both cost in proportion to the heap's free chunks, not to what a trim releases: on a heap
holding 1.4 GiB free in 150,000 holes (a long-lived, fragmented process) ``mallinfo2`` took
50 to 110 ms and a trim 250 to 750 ms, where 1 GiB freed in large blocks took a 202 ms trim.
Checked every second regardless, that held the allocator for a quarter of each second, which
is what stalled a test's 50 cancelled Reads in a full suite run (the process's heap was that
of a pytest worker 1,000 tests in). So the thread waits after each check and trim at least
``1 / MAX_TRIM_SHARE`` times as long as they took (``next_check_after``): on a small heap that
is the interval, on a fragmented one a trim every few tens of seconds, and never more than
``MAX_TRIM_SHARE`` of the time.

On a C library other than glibc (musl unmaps large blocks on free already) ``Trimmer`` does
nothing.
"""

from __future__ import annotations

import collections
import ctypes
import logging
import os
import platform
import threading
import time

log = logging.getLogger(__name__)

TRIM_INTERVAL_SECONDS = 1.0
# The share of wall time the trim thread may spend checking and trimming (module docstring).
MAX_TRIM_SHARE = 0.02
TRIM_FREE_BYTES = 16 * 1024 * 1024
# What must have been freed since the last trim: small, or up to this much freed after a trim
# stays resident (a trim made while 200 cut Reads were still being freed left 33 MiB at 16 MiB).
TRIM_RISE_BYTES = 2 * 1024 * 1024
# How many checks in a row (TRIM_INTERVAL_SECONDS apart) must find the memory free (Trimmer).
TRIM_IDLE_CHECKS = 3


class _Mallinfo2(ctypes.Structure):
    """``struct mallinfo2`` (<malloc.h>, glibc 2.33): ten ``size_t`` counters."""

    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _glibc() -> ctypes.CDLL | None:
    """The C library, when it is glibc with ``mallinfo2`` and ``malloc_trim``; else None. The
    process's own symbols (``CDLL(None)``): no ``ldconfig`` run to find the library."""
    if platform.libc_ver()[0] != "glibc":
        return None
    libc = ctypes.CDLL(None)
    if not hasattr(libc, "mallinfo2") or not hasattr(libc, "malloc_trim"):
        return None
    libc.mallinfo2.restype = _Mallinfo2
    libc.mallinfo2.argtypes = []
    libc.malloc_trim.restype = ctypes.c_int
    libc.malloc_trim.argtypes = [ctypes.c_size_t]
    return libc


class Trimmer:
    """The module docstring's trim, one check at a time (blocking: call it off the loop).

    ``free_bytes()`` → bytes glibc's arenas hold free (``mallinfo2().fordblks``; 0 off glibc);
    ``trim()`` → whether ``malloc_trim(0)`` released memory; ``trim_if_worth_it()`` → whether
    it trimmed: free bytes at least ``free_bytes_threshold`` in each of the last
    ``idle_checks`` samples (this one included), their least risen by ``rise_bytes`` from the
    lowest sample since the last trim (or since this object was made). ``trims`` counts the
    trims.

    Memory a busy process frees and takes again within a few checks (one large Read after
    another) is not idle: trimming it only makes the next buffer fault its pages in again. A
    bench of back-to-back 64 MiB Reads ran at 0.44x BuildGrid's pace with a trim whenever a
    check found memory freed, against 0.57x to 0.96x with no trim (``bench/grpc_cas.py``).
    """

    def __init__(
        self,
        free_bytes_threshold: int = TRIM_FREE_BYTES,
        rise_bytes: int = TRIM_RISE_BYTES,
        idle_checks: int = TRIM_IDLE_CHECKS,
    ) -> None:
        self.free_bytes_threshold = free_bytes_threshold
        self.rise_bytes = rise_bytes
        self.trims = 0
        self._libc = _glibc()
        self._lowest_free = self.free_bytes()  # since the last trim
        self._recent: collections.deque[int] = collections.deque(maxlen=idle_checks)

    @property
    def available(self) -> bool:
        return self._libc is not None

    def free_bytes(self) -> int:
        if self._libc is None:
            return 0
        return int(self._libc.mallinfo2().fordblks)

    def trim(self) -> bool:
        if self._libc is None:
            return False
        self.trims += 1
        return bool(self._libc.malloc_trim(0))

    def trim_if_worth_it(self) -> bool:
        free = self.free_bytes()
        self._lowest_free = min(self._lowest_free, free)
        self._recent.append(free)
        if len(self._recent) < (self._recent.maxlen or 1):
            return False
        idle = min(self._recent)  # free in every recent sample
        if idle < self.free_bytes_threshold:
            return False
        if idle - self._lowest_free < self.rise_bytes:
            return False
        self.trim()
        self._lowest_free = self.free_bytes()
        self._recent.clear()
        return True


def next_check_after(
    cost_seconds: float,
    interval_seconds: float = TRIM_INTERVAL_SECONDS,
    max_share: float = MAX_TRIM_SHARE,
) -> float:
    """Seconds to wait after a check (and trim) that took ``cost_seconds``: the interval, or
    long enough that checking takes at most ``max_share`` of the time (module docstring)."""
    return max(interval_seconds, cost_seconds / max_share)


_started_in_pid: int | None = None
_start_lock = threading.Lock()


def start_trimming() -> bool:
    """Start this process's trim thread (module docstring) unless it runs already; a forked
    child starts its own. True when a thread runs after the call; False off glibc."""
    global _started_in_pid
    with _start_lock:
        if _started_in_pid == os.getpid():
            return True
        trimmer = Trimmer()
        if not trimmer.available:
            return False
        threading.Thread(
            target=_trim_forever, args=(trimmer,), name="kura-malloc-trim", daemon=True
        ).start()
        _started_in_pid = os.getpid()
        return True


def _trim_forever(trimmer: Trimmer) -> None:
    wait = TRIM_INTERVAL_SECONDS  # the first check waits too: a start-up pays for no trim
    while True:
        time.sleep(wait)
        started = time.monotonic()
        try:
            trimmer.trim_if_worth_it()
        except Exception:  # an allocator call cannot fail: say so loudly, and keep going
            log.exception("returning freed memory to the system failed")
        wait = next_check_after(time.monotonic() - started)
