"""What the tmp dir holds on disk, measured off the event loop and cached.

``TmpOccupancy`` walks ``KURA_TMP_DIR`` in a worker thread (``asyncio.to_thread``) every
``REFRESH_INTERVAL_SECONDS`` and keeps two figures: ``total_bytes`` (every regular file) and
``untracked_bytes`` (files no reservation declared it stages into: leftovers, another program's
files). Readers get the cached figures in O(1) and never touch the filesystem, so a reservation,
a growth step of a chunked body or a ``/metrics`` scrape costs no walk. Before this cache the
walk ran on the event loop on every one of them (issue 14).

Freshness: a file that appears or goes away is reflected within one refresh interval (plus the
walk's own duration); ``request_refresh`` (called by a refused reservation) starts a walk
without waiting out the interval, but no sooner than ``MIN_GAP_SECONDS`` after the last one, so
a storm of refusals costs at most one walk per gap.

A file a reservation tracks is never counted as untracked, whichever way its tracking races a
walk: paths tracked when the walk starts, tracked while it runs, or tracked when it ends are all
left out. A tracked file that stays on disk after its reservation is released counts as
untracked from the next walk on.

Only the event loop's thread calls the methods; the worker thread runs ``scan`` alone and
shares nothing with them but its return value.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path

# 4 walks a second: a walk of a tmp dir holding a few hundred staging files costs well under a
# millisecond of a worker thread, and a leftover that goes away is noticed about as fast as the
# waiters' old re-check timer (budget.OUTSIDE_RECHECK_SECONDS) noticed it.
REFRESH_INTERVAL_SECONDS = 0.25
MIN_GAP_SECONDS = 0.05


def scan(tmp_dir: Path, skip: frozenset[str]) -> tuple[int, list[tuple[str, int]]]:
    """Walk ``tmp_dir`` (blocking; run it in a thread).

    Returns (bytes of every regular file, [(path, bytes)] of the files whose path is not in
    ``skip``). Paths are ``os.path.join(root, name)`` of ``os.walk(tmp_dir)``, the form
    ``track`` stores. Files that vanish or cannot be stat'ed mid-walk are left out; a missing
    ``tmp_dir`` reads as empty. Never raises ``OSError``.
    """
    total = 0
    others: list[tuple[str, int]] = []
    for root, _dirs, files in os.walk(tmp_dir):
        for name in files:
            path = os.path.join(root, name)
            try:
                size = os.lstat(path).st_size
            except OSError:  # gone since the listing, or unreadable: not ours to count
                continue
            total += size
            if path not in skip:
                others.append((path, size))
    return total, others


class TmpOccupancy:
    """The cached figures plus the tracked paths. ``on_shrink`` is called (on the loop) when a
    walk finds fewer untracked bytes than the one before: room that waiters should re-check."""

    def __init__(self, tmp_dir: Path, on_shrink: Callable[[], None]) -> None:
        self.tmp_dir = tmp_dir
        self._on_shrink = on_shrink
        self._tracked: set[str] = set()
        self._tracked_during_walk: set[str] | None = None
        self.total_bytes = 0
        self.untracked_bytes = 0
        self.scans_total = 0
        self._lock = asyncio.Lock()
        self._refresh_requested = False  # kept until the next walk starts, even mid-walk
        self._wanted: asyncio.Future[None] | None = None

    def track(self, path: str) -> None:
        self._tracked.add(path)
        if self._tracked_during_walk is not None:
            self._tracked_during_walk.add(path)

    def untrack(self, path: str) -> None:
        self._tracked.discard(path)

    def request_refresh(self) -> None:
        """Ask ``run`` for a walk now rather than at the end of the interval. Never blocks."""
        self._refresh_requested = True
        if self._wanted is not None and not self._wanted.done():
            self._wanted.set_result(None)

    def refresh_now(self) -> None:
        """Walk on the calling thread and update the figures (start-up and tests; never on a
        request path)."""
        self._publish(frozenset(self._tracked), *scan(self.tmp_dir, frozenset(self._tracked)))

    async def refresh(self) -> None:
        """Walk in a worker thread and update the figures. Cancellation leaves them as they
        were."""
        async with self._lock:
            skip = frozenset(self._tracked)
            self._tracked_during_walk = set()
            try:
                total, others = await asyncio.to_thread(scan, self.tmp_dir, skip)
                self._publish(skip | self._tracked_during_walk, total, others)
            finally:
                self._tracked_during_walk = None

    async def run(self) -> None:
        """Refresh every ``REFRESH_INTERVAL_SECONDS`` or on request, until cancelled."""
        loop = asyncio.get_running_loop()
        while True:
            if not self._refresh_requested:
                self._wanted = loop.create_future()
                # asyncio.wait, not wait_for: on Python 3.11 wait_for can swallow a
                # cancellation (see budget.TmpBudget.reserve); this loop must stop with the node.
                await asyncio.wait({self._wanted}, timeout=REFRESH_INTERVAL_SECONDS)
                self._wanted = None
            self._refresh_requested = False
            await self.refresh()
            await asyncio.sleep(MIN_GAP_SECONDS)

    def _publish(self, skip: frozenset[str], total: int, others: list[tuple[str, int]]) -> None:
        before = self.untracked_bytes
        self.total_bytes = total
        self.untracked_bytes = sum(
            size for path, size in others if path not in skip and path not in self._tracked
        )
        self.scans_total += 1
        if self.untracked_bytes < before:
            self._on_shrink()
