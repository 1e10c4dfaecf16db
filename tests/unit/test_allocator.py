"""kit.allocator: the trim returns freed heap memory to the system.

Each case runs in a fresh interpreter, so its heap starts as glibc's own and no other test's
allocations blur the resident-set figures.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from kit.allocator import next_check_after

# Frees 300 x 1 MiB blocks that sit below a live block, so glibc cannot shrink the heap's
# top and keeps their pages resident; then asks kit.allocator.Trimmer to trim if it is worth it.
HELD_AFTER_FREE = r"""
import ctypes, json, os, sys
from kit.allocator import Trimmer

libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
MiB = 1 << 20

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

# glibc's threshold rises past 1 MiB on the first free: the blocks after it come from the heap.
trimmer = Trimmer(free_bytes_threshold=int(sys.argv[1]))
libc.free(libc.malloc(MiB))
blocks = [libc.malloc(MiB) for _ in range(300)]
for b in blocks:
    ctypes.memset(b, 1, MiB)
pin = libc.malloc(512 * 1024)  # carved from the top, above them: the top is in use
before = rss()
for b in blocks:
    libc.free(b)
freed = rss()
free_bytes = trimmer.free_bytes()
busy = []
if sys.argv[2] == "busy":  # taken again between checks: never free three checks running
    for _ in range(3):
        busy.append(trimmer.trim_if_worth_it())
        blocks = [libc.malloc(MiB) for _ in range(300)]
        for b in blocks:
            ctypes.memset(b, 1, MiB)
        busy.append(trimmer.trim_if_worth_it())
        for b in blocks:
            libc.free(b)
        freed = rss()
waiting = [trimmer.trim_if_worth_it() for _ in range(2)]  # free in two checks: not yet idle
first = trimmer.trim_if_worth_it()
after = rss()
second = trimmer.trim_if_worth_it()  # nothing grew since: no second trim
print(json.dumps({"before": before, "freed": freed, "after": after, "free_bytes": free_bytes,
                  "busy": busy, "waiting": waiting, "first": first, "second": second,
                  "trims": trimmer.trims}))
"""


# Variables that change glibc's malloc and would void what the script assumes of the heap.
MALLOC_VARIABLES = (
    "GLIBC_TUNABLES",
    "MALLOC_ARENA_MAX",
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TOP_PAD_",
)


def held(threshold: int, mode: str = "idle") -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k not in MALLOC_VARIABLES}
    out = subprocess.run(
        [sys.executable, "-c", HELD_AFTER_FREE, str(threshold), mode],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    result: dict[str, Any] = json.loads(out.stdout)
    return result


MiB = 1 << 20


def test_the_trimmer_returns_freed_heap_pages_that_free_alone_keeps() -> None:
    r = held(16 * MiB)
    assert r["free_bytes"] >= 290 * MiB, r
    # free() alone kept them: the blocks are below the heap's live top.
    assert r["freed"] > r["before"] - 32 * MiB, r
    assert r["waiting"] == [False, False], r  # free in three checks running before a trim
    assert r["first"], r
    assert r["trims"] == 1, r
    assert r["after"] < r["freed"] - 250 * MiB, r
    # A trim leaves the released chunks in glibc's free lists (free_bytes stays high): the
    # resident set, not the free count, says whether another trim would release anything.
    assert not r["second"], r


def test_memory_taken_again_between_checks_is_not_trimmed_until_it_sits_free() -> None:
    """One large Read after another frees and retakes the same buffers: trimming them would
    only make the next Read fault their pages in again."""
    r = held(16 * MiB, "busy")
    assert r["busy"] == [False] * 6, r
    assert r["first"], r  # once it sat free for three checks
    assert r["trims"] == 1, r


def test_the_trimmer_leaves_the_heap_alone_below_its_threshold() -> None:
    r = held(1 << 40)
    assert not r["first"], r
    assert r["trims"] == 0, r
    assert r["after"] > r["freed"] - 32 * MiB, r


def test_checks_take_at_most_their_share_of_the_time() -> None:
    """A check and trim that took 250 ms (a fragmented 1.4 GiB heap) waits 12.5 s before the
    next; a cheap one, the interval."""
    assert next_check_after(0.001, 1.0, 0.02) == 1.0
    assert next_check_after(0.25, 1.0, 0.02) == 12.5


# Starts the trim thread twice, then forks: the child starts its own, once.
STARTS = r"""
import json, os, threading
from kit.allocator import start_trimming

def trim_threads():
    return sum(t.name == "kura-malloc-trim" for t in threading.enumerate())

first, again = start_trimming(), start_trimming()
parent = trim_threads()
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    inherited = trim_threads()
    started = start_trimming()
    os.write(w, json.dumps([inherited, started, trim_threads()]).encode())
    os._exit(0)
os.waitpid(pid, 0)
child = json.loads(os.read(r, 1000))
print(json.dumps({"first": first, "again": again, "parent": parent, "child": child}))
"""


def test_one_trim_thread_per_process_however_many_nodes_start_it() -> None:
    out = subprocess.run(
        [sys.executable, "-c", STARTS], capture_output=True, text=True, timeout=60, check=True
    )
    r = json.loads(out.stdout)
    assert r == {"first": True, "again": True, "parent": 1, "child": [0, True, 1]}, r
