"""The tmp staging budget: one byte ledger for every occupant of ``KURA_TMP_DIR``.

Every byte staged in the tmp dir is reserved here first. Foreground uploads use
``try_reserve`` and fail fast (503 + Retry-After through ``ResourceExhausted``); background work
(bootstrap) uses ``reserve``, which waits until the bytes fit and never fails because the budget
is full (kura-behaviour.md §0: upstream's hard check on that path re-created the stall).

A ``Reservation`` is released exactly once, on every path: use it as a context manager, or call
``release()`` (idempotent). Release wakes all waiters. Everything runs on one event loop; the
waiter is registered before capacity is re-checked, so a release racing the check cannot be
lost (there is no await between the check and the registration).

All occupants count. Files a reservation stages into are *tracked* (``Reservation.track``);
every other file found on disk under the tmp dir (leftovers, another program's files) is
*outside* the ledger, and a reservation fits only if reserved + outside + n <= capacity. Outside
bytes are measured by a background walk off the event loop (``storage.tmp_occupancy``, run by
``run``), so no reservation touches the filesystem: outside bytes that appear or go away are
counted within one refresh interval (``tmp_occupancy.REFRESH_INTERVAL_SECONDS``), and a refused
reservation asks for a walk at once. Waiters are woken by every release and by a walk that finds
fewer outside bytes, and re-check every ``OUTSIDE_RECHECK_SECONDS`` as well. So the on-disk total
of the tmp dir stays within the capacity as long as nothing outside grows after a reservation
was granted, nor appears less than one refresh interval before it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from kura.core.budget import ByteLedger
from kura.core.errors import PayloadTooLarge, ResourceExhausted
from kura.storage.tmp_occupancy import TmpOccupancy

OUTSIDE_RECHECK_SECONDS = 0.25


class Reservation:
    """Bytes held in a ``TmpBudget``. ``size_bytes`` grows while a body of unknown length
    streams, shrinks only by ``shrink_to`` (a body that ended smaller and stays staged), and
    goes to 0 on release."""

    def __init__(self, budget: TmpBudget, size_bytes: int) -> None:
        self._budget = budget
        self.size_bytes = size_bytes
        self.released = False
        self._paths: list[str] = []
        budget._live.add(self)

    def track(self, path: Path) -> None:
        """Declare that this reservation's bytes live in ``path`` (so they are not counted
        again as outside bytes). Untracked on release."""
        key = str(path)
        self._paths.append(key)
        if self._budget.occupancy is not None:
            self._budget.occupancy.track(key)

    @property
    def capacity_bytes(self) -> int:
        """The budget's whole capacity: the most this reservation can ever grow to."""
        return self._budget.capacity_bytes

    def try_grow_to(self, size_bytes: int) -> None:
        """Grow this reservation to ``size_bytes`` now, or raise.

        Used for bodies without a Content-Length, which reserve as they stream. Raises
        ``PayloadTooLarge`` if ``size_bytes`` exceeds the whole capacity (it could never fit:
        the same answer ``try_reserve`` gives a declared body), ``ResourceExhausted`` if it does
        not fit right now. On either error the reservation keeps its size.
        """
        if self.released:
            raise RuntimeError("reservation already released")
        extra = size_bytes - self.size_bytes
        if extra <= 0:
            return
        self._budget._check_could_ever_fit(size_bytes, growing=True)
        self._budget._take_now(extra)
        self.size_bytes = size_bytes

    def grow_for(self, size_bytes: int, step_to: int) -> None:
        """Cover ``size_bytes`` streamed so far: grow to ``step_to`` (at least ``size_bytes``) if
        that fits now, else to exactly ``size_bytes`` (a small chunked body beside a nearly full
        budget must not fail on the step's overshoot); raises as ``try_grow_to``."""
        target = max(size_bytes, step_to)
        try:
            self.try_grow_to(target)
        except (ResourceExhausted, PayloadTooLarge):
            if target == size_bytes:
                raise
            self.try_grow_to(size_bytes)

    def shrink_to(self, size_bytes: int) -> None:
        """Give back what is held beyond ``size_bytes`` (at least 1): a staged body that stays
        in the tmp dir (a multipart part until its upload completes) holds its real size, not
        the step or the largest size it reserved before its length was known."""
        if self.released:
            raise RuntimeError("reservation already released")
        size_bytes = max(size_bytes, 1)
        if size_bytes < self.size_bytes:
            extra = self.size_bytes - size_bytes
            self.size_bytes = size_bytes
            self._budget._give_back(extra)

    def release(self) -> None:
        """Give the bytes back and wake waiters. Safe to call more than once."""
        if self.released:
            return
        self.released = True
        self._budget._live.discard(self)
        if self._budget.occupancy is not None:
            for key in self._paths:
                self._budget.occupancy.untrack(key)
        self._budget._give_back(self.size_bytes)

    def mark_written(self) -> None:
        """Its body is staged whole (``stage_body`` returned): nothing of it is left to write,
        wherever the file goes next (a commit renames it into the blob dir while this is still
        held), so ``TmpBudget.unwritten_bytes`` no longer counts it."""
        self._budget._live.discard(self)

    def unwritten_bytes(self) -> int:
        """Reserved bytes not in its staging files yet (one ``stat`` per tracked path)."""
        on_disk = 0
        for key in self._paths:
            with contextlib.suppress(OSError):
                on_disk += os.stat(key).st_size
        return max(0, self.size_bytes - on_disk)

    def __enter__(self) -> Reservation:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


class TmpBudget:
    """The ledger plus waiting. Outside bytes are measured under ``tmp_dir`` (or reported by
    ``outside_bytes``, for tests); with neither, nothing outside is counted.

    With ``tmp_dir``, outside bytes read as 0 until the first walk: call ``await refresh()``
    (or ``refresh_now()``) before serving, and keep ``run()`` running while serving."""

    def __init__(
        self,
        capacity_bytes: int,
        outside_bytes: Callable[[], int] | None = None,
        *,
        tmp_dir: Path | None = None,
    ) -> None:
        self._ledger = ByteLedger(capacity_bytes)
        self.occupancy = TmpOccupancy(tmp_dir, self.wake_waiters) if tmp_dir is not None else None
        if outside_bytes is not None:
            self._outside_bytes = outside_bytes
        elif self.occupancy is not None:
            occupancy = self.occupancy
            self._outside_bytes = lambda: occupancy.untracked_bytes
        else:
            self._outside_bytes = lambda: 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._live: set[Reservation] = set()

    @property
    def outside_bytes(self) -> int:
        """Bytes counted against the capacity besides the reservations (cached; no IO)."""
        return self._outside_bytes()

    @property
    def tmp_dir_bytes(self) -> int:
        """Bytes of every file in the tmp dir, ours included, as of the last walk (0 without
        ``tmp_dir``)."""
        return self.occupancy.total_bytes if self.occupancy is not None else 0

    def refresh_now(self) -> None:
        """Measure the tmp dir on this thread, now (start-up, tests). No-op without it."""
        if self.occupancy is not None:
            self.occupancy.refresh_now()

    async def refresh(self) -> None:
        """Measure the tmp dir in a worker thread. No-op without it."""
        if self.occupancy is not None:
            await self.occupancy.refresh()

    async def run(self) -> None:
        """Keep the outside bytes fresh until cancelled (returns at once without a tmp dir)."""
        if self.occupancy is not None:
            await self.occupancy.run()

    @property
    def capacity_bytes(self) -> int:
        return self._ledger.capacity_bytes

    @property
    def reserved_bytes(self) -> int:
        return self._ledger.reserved_bytes

    def unwritten_bytes(self) -> int:
        """Bytes reserved but not yet written to their staging files: what the uploads in
        flight will still add to the tmp dir's filesystem (``storage.state``'s free-space
        floor counts them). O(live reservations) ``stat`` calls; call from the event loop."""
        return sum(r.unwritten_bytes() for r in self._live)

    @property
    def waiting(self) -> int:
        """Reservations currently waiting for room."""
        return len(self._waiters)

    def try_reserve(self, size_bytes: int) -> Reservation:
        """Reserve ``size_bytes`` now or raise.

        Raises ``PayloadTooLarge`` if ``size_bytes`` exceeds the whole capacity (it could never
        fit), ``ResourceExhausted`` if it does not fit right now.
        """
        self._check_could_ever_fit(size_bytes)
        self._take_now(size_bytes)
        return Reservation(self, size_bytes)

    def try_reserve_up_to(self, size_bytes: int) -> Reservation:
        """For a body of unknown length: reserve ``size_bytes`` if that fits now, else 1 byte
        (the reservation then grows as the body arrives, ``Reservation.grow_for``); raises as
        ``try_reserve(1)`` when not even that fits."""
        try:
            return self.try_reserve(size_bytes)
        except (ResourceExhausted, PayloadTooLarge):
            if size_bytes <= 1:
                raise
            return self.try_reserve(1)

    def check_room(self, size_bytes: int) -> None:
        """Raise what ``try_reserve(size_bytes)`` would raise right now, reserving nothing (the
        checks made before answering ``100 Continue``)."""
        self._check_could_ever_fit(size_bytes)
        outside = self._outside_bytes()
        if not self._ledger.fits(size_bytes, outside):
            raise self._exhausted(size_bytes, outside)

    async def reserve(self, size_bytes: int) -> Reservation:
        """Reserve ``size_bytes``, waiting as long as it takes for room.

        ``size_bytes`` is clamped to [1, capacity] so a single large artifact cannot wait
        forever; callers that must not exceed the clamp cap their stream at
        ``Reservation.size_bytes``. Cancellation while waiting leaves nothing reserved.
        """
        size_bytes = self._ledger.clamp(size_bytes)
        while True:
            if self._ledger.take(size_bytes, self._outside_bytes()):
                return Reservation(self, size_bytes)
            if self.occupancy is not None:
                self.occupancy.request_refresh()
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(fut)
            try:
                # Woken by a release; re-check on a timer too, for outside bytes that go away.
                # asyncio.wait, not wait_for: on Python 3.11 wait_for swallows a cancellation
                # that arrives after the future is done, and the cancelled waiter would go on
                # to take the bytes.
                await asyncio.wait({fut}, timeout=OUTSIDE_RECHECK_SECONDS)
            finally:
                if fut in self._waiters:
                    self._waiters.remove(fut)

    def wake_waiters(self) -> None:
        """Wake every waiter to re-check (a release, or outside bytes that went away)."""
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)

    def _check_could_ever_fit(self, size_bytes: int, *, growing: bool = False) -> None:
        if size_bytes > self._ledger.capacity_bytes:
            raise PayloadTooLarge(
                f"body of {'at least ' if growing else ''}{size_bytes} bytes is larger than "
                "the node's tmp staging budget "
                f"({self._ledger.capacity_bytes} bytes)",
                self._ledger.capacity_bytes,
            )

    def _take_now(self, size_bytes: int) -> None:
        outside = self._outside_bytes()
        if not self._ledger.take(size_bytes, outside):
            raise self._exhausted(size_bytes, outside)

    def _exhausted(self, size_bytes: int, outside: int) -> ResourceExhausted:
        # A refusal may rest on a file that has gone away since the last walk: look again now.
        if self.occupancy is not None:
            self.occupancy.request_refresh()
        return ResourceExhausted(
            "temporary storage budget exhausted: "
            f"{self._ledger.reserved_bytes} bytes reserved, {outside} bytes of other files, "
            f"{size_bytes} bytes requested, {self._ledger.capacity_bytes} bytes allowed"
        )

    def _give_back(self, size_bytes: int) -> None:
        self._ledger.give_back(size_bytes)
        self.wake_waiters()
