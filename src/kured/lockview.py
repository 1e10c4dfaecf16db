"""The lock holders as this agent last read them, for decisions, ``kured status`` and metrics.

Status and metrics must follow the lock store, not the last tick (issue 15: after the
post-reboot release they showed the lock held for up to a period while etcd was empty). So
every ``/status`` request and every ``/metrics`` scrape calls ``refresh`` - one read of the lock
record (a single etcd range request or DaemonSet GET), bounded by ``READ_TIMEOUT_SECONDS`` - and the
agent refreshes after each acquire and release too. Concurrent callers share one read: a caller
that arrives while a read is in flight waits for it and uses its answer (at most one read's
duration old).

When a read fails the last-known holders are kept and marked **stale**: ``error`` says why and
``age_seconds`` how old they are. ``read_at`` is None until the first successful read.
"""

from __future__ import annotations

import asyncio

from kit.clock import Clock
from kured.core.errors import LockError
from kured.locks.base import Holder, Lock

# Upper bound of one read for status and metrics; a scrape must not hang on a stalled store.
READ_TIMEOUT_SECONDS = 3.0


class LockView:
    """Last-known holders of ``lock`` (see the module docstring). One per agent; safe to call
    from many tasks of one event loop."""

    def __init__(self, lock: Lock, clock: Clock) -> None:
        self._lock = lock
        self._clock = clock
        self.holders: tuple[Holder, ...] = ()
        self.read_at: float | None = None  # unix seconds of the last successful read
        self.error = ""  # why the last read failed; '' after a successful one
        self._inflight: asyncio.Future[tuple[Holder, ...]] | None = None

    @property
    def stale(self) -> bool:
        return bool(self.error)

    def age_seconds(self) -> float | None:
        """Seconds since the last successful read, or None when there was none."""
        if self.read_at is None:
            return None
        return max(0.0, self._clock.now_ms() / 1000 - self.read_at)

    async def refresh(self, timeout_seconds: float | None = None) -> tuple[Holder, ...]:
        """Read the holders now, or share the read already in flight. Returns them in record
        order, expired ones included. Raises ``LockError`` when the read fails, or when no
        answer came within ``timeout_seconds`` (None: the lock's own request timeouts only;
        the read then goes on for later callers); the last-known holders are then kept and
        marked stale."""
        if self._inflight is None or self._inflight.done():
            self._inflight = asyncio.ensure_future(self._read())
            self._inflight.add_done_callback(_retrieve)
        try:
            async with asyncio.timeout(timeout_seconds):
                return await asyncio.shield(self._inflight)
        except TimeoutError as exc:
            self.error = f"no answer from the lock store within {timeout_seconds:g}s"
            raise LockError(self.error) from exc

    async def _read(self) -> tuple[Holder, ...]:
        try:
            holders = tuple(await self._lock.holders())
        except LockError as exc:
            self.error = exc.message
            raise
        self.holders, self.error = holders, ""
        self.read_at = self._clock.now_ms() / 1000
        return holders


def _retrieve(task: asyncio.Future[tuple[Holder, ...]]) -> None:
    """Mark a failed read's exception as seen: every caller got it already, or none waited."""
    if not task.cancelled():
        task.exception()
