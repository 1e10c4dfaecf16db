"""Keep work within a rate: after ``done`` units since ``start``, wait until ``done / rate``
seconds have passed. One rule for every paced loop (expiry passes, touch markers, throttled
peer downloads, the scrubber), so they all mean the same by "at most N per second"."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable


def seconds_ahead(done: float, rate: float, elapsed_seconds: float) -> float:
    """How long to wait (0 when behind) so ``done`` units take at least ``done / rate`` s."""
    return max(0.0, done / rate - elapsed_seconds)


class Pace:
    """An async pacer over ``monotonic`` (seconds) and ``sleep`` (both injectable for virtual
    time). ``await pace.wait(done)`` with the running total since construction."""

    def __init__(
        self,
        rate: float,
        monotonic: Callable[[], float],
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:
        if rate <= 0:
            raise ValueError("rate must be above 0")
        self._rate, self._monotonic, self._sleep = rate, monotonic, sleep
        self._start = monotonic()

    async def wait(self, done: float) -> None:
        ahead = seconds_ahead(done, self._rate, self._monotonic() - self._start)
        if ahead > 0:
            await self._sleep(ahead)
