"""A budget of log lines for events a client can cause at will (malformed requests): whatever
the rate of events, at most ``lines`` of them are logged per ``interval_seconds``, and the next
line logged after a quiet spell says how many were left out, so nothing goes unaccounted for
while the log stays small."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class LogLimit:
    """At most ``lines`` admissions per window of ``interval_seconds`` (on ``clock``, seconds;
    injectable for tests). Safe to call from any thread (grpcio deserialises in its own)."""

    def __init__(
        self,
        lines: int,
        interval_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if lines < 1 or interval_seconds <= 0:
            raise ValueError("a log limit needs lines >= 1 and interval_seconds > 0")
        self._lines, self._interval, self._clock = lines, interval_seconds, clock
        self._window_started = float("-inf")
        self._admitted = 0
        self._suppressed = 0
        self._lock = threading.Lock()

    def admit(self) -> int | None:
        """None when this event is to be left out of the log; otherwise the number of events
        left out since the last one admitted (0: none), which the line should mention."""
        with self._lock:
            now = self._clock()
            if now - self._window_started >= self._interval:
                self._window_started, self._admitted = now, 0
            if self._admitted >= self._lines:
                self._suppressed += 1
                return None
            self._admitted += 1
            suppressed, self._suppressed = self._suppressed, 0
            return suppressed
