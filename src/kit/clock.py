"""Injectable time, so loops and policies can be tested on virtual time.

``Clock.now_ms`` is wall-clock time (integer milliseconds since the epoch, for stamps that are
stored or sent); ``Clock.monotonic`` is seconds on a monotonic scale (for timeouts and rates).
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """A source of time. Implementations must be safe to call from any thread."""

    def now_ms(self) -> int: ...

    def monotonic(self) -> float: ...


class SystemClock:
    """The real clock."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock that moves only when told to (tests)."""

    def __init__(self, now_ms: int = 1_700_000_000_000, monotonic: float = 1000.0) -> None:
        self._now_ms = now_ms
        self._monotonic = monotonic

    def now_ms(self) -> int:
        return self._now_ms

    def monotonic(self) -> float:
        return self._monotonic

    def advance(self, seconds: float) -> None:
        self._now_ms += int(seconds * 1000)
        self._monotonic += seconds
