"""What a node's start-up still runs once its listeners are up, and the waits it imposes
(issue 31 item 2: start-up time that does not grow with the cache; bazel-remote #898 and #529,
a 20-minute cold start with 8 M files, are the reports behind it).

``kura serve`` does only the cheap part of ``storage.recovery`` before it listens (the data dir
lock, the tmp dir's staging sweep, opening the index, and the layout-1 migration, which runs once
per data dir), then runs the rest in the background, in two phases, on one thread:

1. ``checking``: ``PRAGMA quick_check``, a first read of every row (the totals the disk
   budget starts from) and the range digests' check (``recovery.check_index``). Meanwhile a
   read waits on the event loop (``wait_readable``, before anything goes to the reader pool),
   at most ``wait_seconds`` from when it starts waiting, then raises ``Unavailable`` (503 with
   ``Retry-After``; gRPC ``UNAVAILABLE``). The index is also *held* (``MetadataIndex.hold``):
   a query from any other thread raises ``Unavailable`` at once, it never waits in a thread.
   Reads are therefore served only once the check passed, and no other thread has a
   connection in use when it fails, so the damaged index is set aside and a fresh one made in
   place (``recovery``'s damage path) with nothing in flight against it.
2. ``reconciling``: ``storage.reconcile`` walks rows and files and removes what a crash left.
   Reads are served (a row without its file is a miss, a file without a row is never served);
   every write waits for the end of this phase, at most ``wait_seconds``, then raises
   ``Unavailable``: reconcile removes files no committed row names, so a write publishing its
   file beside the old version before its row commits must not run while it walks. A write is
   refused at once, before its body is read, when the estimate of the time left
   (``retry_after_seconds``) is past the wait (``refuses_writes_now``).

``wait_seconds`` is at most ``MAX_WAIT_SECONDS`` (the setting's validation,
``KURA_STARTUP_WAIT_SECONDS``). Each wait is bounded by it, counted from when that wait starts
(no caller passes ``arrived`` yet): a request that reads and then writes (a bazel CAS PUT, nx,
xcode, gradle, a ByteStream ``Write``: each asks whether it is stored first) may wait twice,
up to 2 x ``wait_seconds``.

A stop (``stop``, from ``CacheService.stop_startup``: SIGTERM, ``Node.stop``) answers every
request waiting here at once, reads and writes alike, and every one arriving after it:
``Unavailable`` (503, ``Retry-After: STOPPING_RETRY_SECONDS``; gRPC ``UNAVAILABLE``) saying
the node is stopping. The work they waited for will not finish in this process, so a waiter
held to the end of its wait only held the stop's drain for as long (a tester's SIGTERM
mid-reconciliation exited after 8.7 s, the PUTs' whole wait, and told them "reconciling").

A stop (``CacheService.stop_startup``) is seen inside a running statement: the start-up
connection's progress handler (``sqlite3.Connection.set_progress_handler``, every
``statement_steps`` VM steps; ``PRAGMA quick_check`` calls it per page it checks) answers
the stop flag, and SQLite aborts the statement with ``interrupted``.

Stopping mid-way loses nothing: the work only deletes what no committed row names, or rows
whose file is gone, so the next start simply does it again. ``reasons`` are ``/ready``'s while
it runs (``Node.readiness_reasons``), with its progress.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from kit.clock import Clock, SystemClock
from kit.failpoint import failpoint
from kura.core.errors import Unavailable

CHECKING = "checking"
RECONCILING = "reconciling"
# The longest a request may wait for the start-up work (KURA_STARTUP_WAIT_SECONDS's bound).
MAX_WAIT_SECONDS = 60
# SQLite VM steps between two looks at the stop flag in a start-up statement (module docstring).
STATEMENT_STEPS = 1000
# The Retry-After of a request refused because the node is stopping (module docstring): a
# supervisor's restart, or another node behind the balancer, is seconds away.
STOPPING_RETRY_SECONDS = 5


class StartupWork:
    """The phase and progress of the background start-up work, and its waits (module
    docstring). Phases are entered on the start-up thread; the waits, ``mark_checked`` and
    ``finish`` on the event loop. Times are seconds on ``clock.monotonic``."""

    def __init__(self, wait_seconds: float, clock: Clock | None = None) -> None:
        self.wait_seconds = wait_seconds
        self.clock: Clock = clock or SystemClock()
        self.phase = CHECKING
        # Index rows reconciled so far, and the row count the check found (0 before it).
        self.rows_done = 0
        self.rows_expected = 0
        # SQLite VM steps between looks at the stop flag (a test lowers it for a tiny index).
        self.statement_steps = STATEMENT_STEPS
        self._phase_started = self.clock.monotonic()
        # Set on the event loop: the index passed its check (or was replaced); all is done.
        self._checked = asyncio.Event()
        self._done = asyncio.Event()
        # Set by ``stop`` (any thread); the event wakes the waiters on their loop.
        self.stopped = False
        self._stopping = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        # Called on the start-up thread at each point (``at``): tests pause the work there.
        self.hook: Callable[[str], None] = lambda point: None

    @property
    def done(self) -> bool:
        return self._done.is_set()

    @property
    def checked(self) -> bool:
        """Whether the index passed its check (or a damaged one was replaced)."""
        return self._checked.is_set()

    async def wait_checked(self) -> None:
        """Return once the index passed its check (or a damaged one was replaced)."""
        await self._checked.wait()

    async def wait_done(self) -> None:
        """Return once all of it ran (``finish``)."""
        await self._done.wait()

    def at(self, point: str) -> None:
        """Start-up thread, at ``point``: ``"check"`` (before ``PRAGMA quick_check``),
        ``"reconcile"`` (reads served, before the reconciliation lists a file),
        ``"reconcile_page"`` (after each page of rows reconciled) or ``"statement"`` (inside a
        start-up statement, from the connection's progress handler: no failpoint there, it
        runs every ``statement_steps`` steps). The failpoint ``startup.<point>`` fires at the
        first three (``kit.failpoint``: a test kills the process mid-reconcile), and
        ``hook(point)`` runs at all four (an in-process test waits on an event)."""
        if point != "statement":
            failpoint(f"startup.{point}")
        self.hook(point)

    def reconciling(self, rows_expected: int) -> None:
        """Start-up thread: the check is over, reconciliation of ``rows_expected`` rows begins."""
        self.rows_expected = rows_expected
        self.rows_done = 0
        self.phase = RECONCILING
        self._phase_started = self.clock.monotonic()

    def mark_checked(self) -> None:
        """Event loop: the index check is over (``wait_checked`` returns)."""
        self._checked.set()

    def finish(self) -> None:
        """Event loop: everything ran; writes are taken from now on."""
        self.phase = ""
        self._checked.set()
        self._done.set()

    def stop(self) -> None:
        """The node is stopping (module docstring): every request waiting on this work, and
        every one arriving from now on, gets ``unavailable()`` at once. Any thread; once is
        enough, again is harmless."""
        self.stopped = True
        loop = self._loop
        if loop is None:  # nobody waited yet: the flag is all a later wait looks at
            return
        try:
            here = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        if here is loop:
            self._stopping.set()
        elif not loop.is_closed():
            loop.call_soon_threadsafe(self._stopping.set)

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
                round(self.clock.monotonic() - self._phase_started, 1) if self.phase else None
            ),
        }

    def unavailable(self) -> Unavailable:
        """The error a request gets when it waited in vain, or is refused at once: 503 with
        ``Retry-After`` from ``retry_after_seconds``, naming what still runs; once stopped
        (``stop``), saying the node is stopping, with ``Retry-After: STOPPING_RETRY_SECONDS``."""
        if self.stopped:
            return Unavailable(
                "the node is stopping: its start-up work was stopped before this request could "
                "be served; retry (another node, or this one once it has restarted)",
                retry_after_seconds=STOPPING_RETRY_SECONDS,
            )
        reason = self.reasons()[0] if self.reasons() else "start-up: finishing"
        return Unavailable(reason, retry_after_seconds=self.retry_after_seconds())

    def seconds_left(self) -> float | None:
        """The estimate of the seconds the work still needs, from the reconciliation's rate so
        far (rows reconciled per second); None while there is no rate to go by (the check,
        the first page)."""
        if self.phase != RECONCILING or not self.rows_done:
            return None
        per_row = (self.clock.monotonic() - self._phase_started) / self.rows_done
        return per_row * max(0, self.rows_expected - self.rows_done)

    def retry_after_seconds(self) -> int:
        """A guess of the seconds left (``seconds_left`` plus one; 5 without an estimate),
        between 1 and 60: every refusal's ``Retry-After``."""
        left = self.seconds_left()
        return max(1, min(60, round(5.0 if left is None else left + 1)))

    def refuses_writes_now(self) -> bool:
        """Whether a write arriving now should be refused at once, before its body is read:
        the work is not done and the estimate of the time left is past ``wait_seconds`` (the
        write would wait in vain and upload its body again), or the node is stopping."""
        if self.stopped and not self.done:
            return True
        left = None if self.done else self.seconds_left()
        return left is not None and left > self.wait_seconds

    async def wait_readable(self, arrived: float | None = None) -> None:
        """Return once reads are safe (the index passed its check); ``Unavailable`` once
        ``wait_seconds`` have passed since ``arrived`` (``clock.monotonic``; None: now), or at
        once when the node is stopping (``stop``). On the event loop, before the read goes to
        a reader thread."""
        if not self._checked.is_set():
            await self._wait(self._checked, arrived)

    async def wait_writable(self, arrived: float | None = None) -> None:
        """Return once writes are safe (this work is done); ``Unavailable`` once
        ``wait_seconds`` have passed since ``arrived`` (None: now), or at once when
        ``refuses_writes_now`` or the node is stopping (``stop``)."""
        if self._done.is_set():
            return
        if self.refuses_writes_now():
            raise self.unavailable()
        await self._wait(self._done, arrived)

    async def _wait(self, event: asyncio.Event, arrived: float | None) -> None:
        """Until ``event`` is set; ``unavailable()`` at the end of the wait, or at once when
        ``stop`` was or is called meanwhile."""
        self._loop = asyncio.get_running_loop()  # before the look: a ``stop`` now sees it
        if self.stopped:
            raise self.unavailable()
        now = self.clock.monotonic()
        left = self.wait_seconds - (now - (now if arrived is None else arrived))
        waits = {asyncio.ensure_future(event.wait()), asyncio.ensure_future(self._stopping.wait())}
        try:
            async with self.clock.timeout(max(0.0, left)):
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        except TimeoutError:
            raise self.unavailable() from None
        finally:
            for wait in waits:
                wait.cancel()
        if not event.is_set():  # stopped
            raise self.unavailable()

    def _elapsed(self) -> str:
        return f"{self.clock.monotonic() - self._phase_started:.1f} s so far"
