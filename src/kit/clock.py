"""Injectable time, so loops and policies can be tested on virtual time.

``Clock.now_ms`` is wall-clock time (integer milliseconds since the epoch, for stamps that are
stored or sent); ``Clock.monotonic`` is seconds on a monotonic scale (for timeouts and rates).
``Clock.sleep`` and ``Clock.timeout`` are ``asyncio.sleep`` and ``asyncio.timeout`` on that
clock's time: a loop that sleeps and bounds its work through its clock runs on virtual time
unchanged under ``ManualClock``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Protocol


class Clock(Protocol):
    """A source of time. ``now_ms`` and ``monotonic`` are safe to call from any thread;
    ``sleep`` and ``timeout`` from the event loop's thread."""

    def now_ms(self) -> int: ...

    def monotonic(self) -> float: ...

    async def sleep(self, seconds: float) -> None:
        """Return after ``seconds`` (≤ 0: at once, after yielding to the loop)."""
        ...

    def timeout(self, seconds: float | None) -> contextlib.AbstractAsyncContextManager[None]:
        """``asyncio.timeout`` counted on this clock: the body is cancelled and ``TimeoutError``
        raised once ``seconds`` have passed (None: no bound)."""
        ...


class SystemClock:
    """The real clock."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    @contextlib.asynccontextmanager
    async def timeout(self, seconds: float | None) -> AsyncIterator[None]:
        async with asyncio.timeout(seconds):
            yield


class ManualClock:
    """A clock that moves only when told to (tests): by ``advance``, or by a ``sleep``, which
    moves it by the time slept and returns at once (after yielding to the loop). Concurrent
    sleepers each move it, so virtual time never runs slower than real time would: no sleeper
    wakes before its deadline. A ``timeout`` whose deadline the clock passes fires at the next
    ``await`` of the body."""

    def __init__(self, now_ms: int = 1_700_000_000_000, monotonic: float = 1000.0) -> None:
        self._now_ms = now_ms
        self._monotonic = monotonic
        # Open timeouts: (deadline on ``monotonic``, the asyncio timeout to fire).
        self._deadlines: list[tuple[float, asyncio.Timeout]] = []

    def now_ms(self) -> int:
        return self._now_ms

    def monotonic(self) -> float:
        return self._monotonic

    def advance(self, seconds: float) -> None:
        self._now_ms += int(seconds * 1000)
        self._monotonic += seconds
        for deadline, scope in self._deadlines:
            if self._monotonic >= deadline and scope.when() is None:
                scope.reschedule(asyncio.get_running_loop().time())

    async def sleep(self, seconds: float) -> None:
        if seconds > 0:
            self.advance(seconds)
        await asyncio.sleep(0)

    @contextlib.asynccontextmanager
    async def timeout(self, seconds: float | None) -> AsyncIterator[None]:
        async with asyncio.timeout(None) as scope:
            if seconds is None:
                yield
                return
            entry = (self._monotonic + seconds, scope)
            if seconds <= 0:  # already due, as asyncio.timeout(0) is
                scope.reschedule(asyncio.get_running_loop().time())
            self._deadlines.append(entry)
            try:
                yield
            finally:
                self._deadlines.remove(entry)
