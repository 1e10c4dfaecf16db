"""The object store's circuit breaker: a store that keeps failing is skipped, not waited on.

Issue 26 item 6: while the store hung (its process SIGSTOPped), every local miss waited the
whole ``KURA_OBJECT_STORE_TIMEOUT`` (30 s by default) before it was answered 404. The breaker
counts consecutive failures that say "the store is not answering" (``FAILURES``: timeouts,
refused or reset connections, 5xx, throttling). At ``failures_to_open`` in a row it *opens*:
every request is refused at once, without being sent (``CircuitOpen``), so a miss is a local
miss again. Every ``cooldown_seconds`` one *probe* request is let through (``enter(probe=True)``:
the tier's prober sends a HEAD, ``ObjectTier``), never a client's miss, so no miss waits for a
hung store even while it is probed: its answer closes the breaker, its failure keeps it open
for another cool-down. Any answer from the store (2xx, 404,
even a refused credential) resets the count: the store is there. This is the usual pattern
(M. Nygard, "Release It!", ch. "Circuit Breaker"); it lives here, in storage, beside the one
client that every request to the store goes through (``ObjectStore._call``).

A transient outage never latches: the probe closes the breaker by itself once the store
answers again. Time comes from the injected monotonic clock (``kit.clock.Clock``). Safe on one
event loop (no awaits inside); not thread-safe.
"""

from __future__ import annotations

from dataclasses import dataclass

from kit.clock import Clock

# The ``ObjectStoreStats`` results that say the store is not answering (the others are answers).
FAILURES = frozenset({"timeout", "unreachable", "server_error", "throttled"})


@dataclass
class BreakerState:
    """What ``/ready`` warnings and the metrics read: plain values, changed on the loop."""

    open: bool = False
    consecutive_failures: int = 0
    last_failure: str = ""  # the result of the last failure ("" before one)
    opened_total: int = 0  # times it opened from closed (a failed probe keeps it open)
    skipped_total: int = 0  # requests refused without being sent


class Breaker:
    """See module docstring. ``failures_to_open`` >= 1, ``cooldown_seconds`` > 0."""

    def __init__(self, clock: Clock, failures_to_open: int, cooldown_seconds: float) -> None:
        self._clock = clock
        self.failures_to_open = failures_to_open
        self.cooldown_seconds = cooldown_seconds
        self.state = BreakerState()
        self._retry_at = 0.0  # monotonic seconds: when an open breaker lets a probe through
        self._probing = False

    def enter(self, probe: bool = False) -> bool | None:
        """Before sending a request: False when the breaker is closed (send it); while open,
        None (refuse it), except for a ``probe`` once the cool-down is over and no other probe
        is out: True (send it; ``record`` its result, then call ``probe_ended`` however it
        ended, cancelled included)."""
        if not self.state.open:
            return False
        if not probe or self._probing or not self.probe_due():
            if not probe:
                self.state.skipped_total += 1
            return None
        self._probing = True
        return True

    def probe_due(self) -> bool:
        """Whether the breaker is open and its cool-down over."""
        return self.state.open and self._clock.monotonic() >= self._retry_at

    def record(self, result: str) -> None:
        """A request ended with ``result`` (an ``ObjectStoreStats`` result; ``"ok"`` for a
        success). Opens the breaker, or keeps it open for another cool-down, on a failure that
        reaches ``failures_to_open`` in a row; closes it on any answer."""
        if result not in FAILURES:
            self.state.consecutive_failures = 0
            self.state.open = False
            return
        self.state.consecutive_failures += 1
        self.state.last_failure = result
        if self.state.open or self.state.consecutive_failures >= self.failures_to_open:
            self._retry_at = self._clock.monotonic() + self.cooldown_seconds
            if not self.state.open:
                self.state.opened_total += 1
            self.state.open = True

    def probe_ended(self) -> None:
        """The probe is over (answered, failed or cancelled): the next due probe may go."""
        self._probing = False
