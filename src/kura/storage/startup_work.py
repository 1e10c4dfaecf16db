"""What a node's start-up still runs once its listeners are up, and the waits it imposes
(issue 31 item 2: start-up time that does not grow with the cache; bazel-remote #898 and #529,
a 20-minute cold start with 8 M files, are the reports behind it).

``kura serve`` does only the cheap part of ``storage.recovery`` before it listens (the data dir
lock, the tmp dir's staging sweep, opening the index, and the layout-1 migration, which runs once
per data dir), then runs the rest in the background, in two phases, on one thread:

1. ``checking``: ``PRAGMA quick_check`` and a first read of every row (the totals the disk
   budget starts from). Meanwhile the index is *held* (``MetadataIndex.hold``): a query from any
   other thread waits for the check, at most ``wait_seconds``, then raises ``Unavailable``
   (503 with ``Retry-After``; gRPC ``UNAVAILABLE``). Reads are therefore served only once the
   check passed, and no other thread has a connection in use when it fails, so the damaged
   index is set aside and a fresh one made in place (``recovery``'s damage path) with nothing
   in flight against it.
2. ``reconciling``: ``storage.reconcile`` walks rows and files and removes what a crash left.
   Reads are served (a row without its file is a miss, a file without a row is never served);
   every write waits for the end of this phase, at most ``wait_seconds``, then raises
   ``Unavailable``: reconcile removes files no committed row names, so a write publishing its
   file beside the old version before its row commits must not run while it walks.

Stopping mid-way loses nothing: the work only deletes what no committed row names, or rows
whose file is gone, so the next start simply does it again. ``reasons`` are ``/ready``'s while
it runs (``Node.readiness_reasons``), with its progress.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from kit.failpoint import failpoint
from kura.core.errors import Unavailable

CHECKING = "checking"
RECONCILING = "reconciling"


class StartupWork:
    """The phase and progress of the background start-up work, and its waits (module
    docstring). Phases are entered on the start-up thread; ``wait_writable`` and ``finish`` on
    the event loop."""

    def __init__(self, wait_seconds: float) -> None:
        self.wait_seconds = wait_seconds
        self.phase = CHECKING
        # Index rows reconciled so far, and the row count the check found (0 before it).
        self.rows_done = 0
        self.rows_expected = 0
        self._phase_started = time.monotonic()
        # Set on the event loop: the index passed its check (or was replaced); all is done.
        self._checked = asyncio.Event()
        self._done = asyncio.Event()
        # Called on the start-up thread at each point (``at``): tests pause the work there.
        self.hook: Callable[[str], None] = lambda point: None

    @property
    def done(self) -> bool:
        return self._done.is_set()

    async def wait_checked(self) -> None:
        """Return once the index passed its check (or a damaged one was replaced)."""
        await self._checked.wait()

    async def wait_done(self) -> None:
        """Return once all of it ran (``finish``)."""
        await self._done.wait()

    def at(self, point: str) -> None:
        """Start-up thread, at ``point``: ``"check"`` (before ``PRAGMA quick_check``) or
        ``"reconcile_page"`` (after each page of rows reconciled). The failpoint
        ``startup.<point>`` fires there (``kit.failpoint``: a test kills the process
        mid-reconcile), and ``hook(point)`` runs (an in-process test waits on an event)."""
        failpoint(f"startup.{point}")
        self.hook(point)

    def reconciling(self, rows_expected: int) -> None:
        """Start-up thread: the check is over, reconciliation of ``rows_expected`` rows begins."""
        self.rows_expected = rows_expected
        self.rows_done = 0
        self.phase = RECONCILING
        self._phase_started = time.monotonic()

    def mark_checked(self) -> None:
        """Event loop: the index check is over (``wait_checked`` returns)."""
        self._checked.set()

    def finish(self) -> None:
        """Event loop: everything ran; writes are taken from now on."""
        self.phase = ""
        self._checked.set()
        self._done.set()

    def reasons(self) -> list[str]:
        """What is still running, for ``/ready`` (empty once done), e.g. ``start-up:
        reconciling files with the index (412,000 of ~1,000,000 rows); writes wait``."""
        if self.phase == CHECKING:
            return [
                f"start-up: PRAGMA quick_check running ({self._elapsed()}); reads and writes "
                f"wait for it (up to {self.wait_seconds:g} s, then 503)"
            ]
        if self.phase == RECONCILING:
            return [
                f"start-up: reconciling files with the index ({self.rows_done:,} of "
                f"~{self.rows_expected:,} rows, {self._elapsed()}); reads are served, writes "
                f"wait for it (up to {self.wait_seconds:g} s, then 503)"
            ]
        return []

    def as_json(self) -> dict[str, object]:
        """``/status``'s ``startup``: the phase (``checking``, ``reconciling`` or ``done``),
        rows reconciled and expected, and the seconds the phase has run (null once done)."""
        return {
            "phase": self.phase or "done",
            "rows_done": self.rows_done,
            "rows_expected": self.rows_expected,
            "phase_seconds": (
                round(time.monotonic() - self._phase_started, 1) if self.phase else None
            ),
        }

    def unavailable(self) -> Unavailable:
        """The error a request gets when it waited ``wait_seconds`` in vain."""
        reason = self.reasons()[0] if self.reasons() else "start-up: finishing"
        return Unavailable(reason, retry_after_seconds=self.retry_after_seconds())

    def retry_after_seconds(self) -> int:
        """A guess of the seconds left, from the progress so far: between 1 and 60."""
        elapsed = time.monotonic() - self._phase_started
        left = 5.0
        if self.phase == RECONCILING and self.rows_done:
            per_row = elapsed / self.rows_done
            left = per_row * max(0, self.rows_expected - self.rows_done) + 1
        return max(1, min(60, round(left)))

    async def wait_writable(self) -> None:
        """Return once writes are safe (this work is done); ``Unavailable`` (503 with
        ``Retry-After``) after ``wait_seconds``."""
        if self._done.is_set():
            return
        try:
            await asyncio.wait_for(self._done.wait(), self.wait_seconds)
        except TimeoutError:
            raise self.unavailable() from None

    def _elapsed(self) -> str:
        return f"{time.monotonic() - self._phase_started:.1f} s so far"
