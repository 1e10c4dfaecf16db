"""Jittered exponential backoff: the one retry policy of kura's per-peer loops and of kured's
bounded retries (409 conflicts, lost compares, refused evictions, a failing uncordon).

The delay after the ``n``-th failure in a row (``n >= 1``), in seconds::

    ceiling(n) = min(cap_seconds, base_seconds * 2 ** (n - 1))
    delay(n)   = uniform(ceiling(n) * (1 - jitter), ceiling(n))

``jitter=1`` is "full jitter", ``jitter=0.5`` "equal jitter" (never less than half the
ceiling), ``jitter=0`` none (Marc Brooker, "Exponential Backoff And Jitter", AWS Architecture
Blog, 2015: https://aws.amazon.com/blogs/architecture/exponential-backoff-and-jitter/). Jitter
spreads the retries of many clients that failed together (every node of a mesh losing the same
peer, every kured agent losing the same compare), so they do not all return at the same instant.

Why our own module rather than stamina or tenacity: both wrap a *call* ("retry this up to N
times or for T seconds") and keep the attempt count inside that call. Most loops here are not
calls. The shipper and bootstrap keep per-peer state across iterations of a loop that runs
forever: they back off while a peer is down, reset when it answers or when membership (another
task) sees it healthy again, and wait on an event *or* the backoff's deadline instead of
sleeping. What they need is a value they own (failures so far, the last delay, the deadline on
their injected clock), and the bounded retries need only ``sleep()``. A random.Random can be
injected, so delays are deterministic in tests, and the deadline uses the caller's clock, so
loops run on virtual time unchanged.

``every()`` is the periodic loop built on it (membership's discovery, the outbox end-of-life
check, anti-entropy): an iteration each interval; one that raises is logged with its traceback
and the loop backs off with jitter, up to ``ERROR_CAP_SECONDS``, until an iteration succeeds,
rather than failing (and logging a traceback) at full rate every interval.

Instances are not thread-safe; each belongs to one loop (one peer) or one call.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import NoReturn

# Past this exponent every ceiling is the cap (2.0 ** 1024 overflows a float).
_MAX_EXPONENT = 1000
# ``every()``: the longest pause after failed iterations in a row, unless the interval is longer.
ERROR_CAP_SECONDS = 60.0


class Backoff:
    """Backoff state for one loop or one call: ``failed()`` after a failure, ``reset()`` after a
    success. ``base_seconds > 0``, ``cap_seconds > 0`` (a cap below the base caps every delay,
    as the shipper's ``KURA_REPLICATION_BACKOFF_MAX_MS`` may), ``0 <= jitter <= 1`` (ValueError
    otherwise); ``rng`` draws the jitter (a fresh random.Random by default)."""

    def __init__(
        self,
        base_seconds: float,
        cap_seconds: float,
        *,
        jitter: float = 1.0,
        rng: random.Random | None = None,
    ) -> None:
        if not base_seconds > 0:
            raise ValueError(f"backoff base must be > 0 seconds, not {base_seconds}")
        if not cap_seconds > 0:
            raise ValueError(f"backoff cap must be > 0 seconds, not {cap_seconds}")
        if not 0 <= jitter <= 1:
            raise ValueError(f"backoff jitter must be within [0, 1], not {jitter}")
        self.base_seconds = base_seconds
        self.cap_seconds = cap_seconds
        self.jitter = jitter
        self._rng = rng or random.Random()
        self.failures = 0  # failures in a row since the last reset
        self.delay_seconds = 0.0  # the last delay drawn; 0 after a reset
        self.until = 0.0  # the deadline ``failed(now)`` set, on the caller's clock; 0: none

    def ceiling(self, failures: int) -> float:
        """The longest delay after ``failures`` (>= 1) failures in a row, in seconds."""
        exponent = min(max(failures, 1) - 1, _MAX_EXPONENT)
        return min(self.cap_seconds, self.base_seconds * 2.0**exponent)

    def draw(self, failures: int) -> float:
        """A delay for ``failures`` failures in a row, within
        ``[ceiling * (1 - jitter), ceiling]`` seconds; does not change the state."""
        ceiling = self.ceiling(failures)
        return self._rng.uniform(ceiling * (1 - self.jitter), ceiling)

    def failed(self, now: float | None = None) -> float:
        """Count a failure and return the delay to wait before the next attempt, in seconds.
        With ``now`` (the caller's monotonic seconds) also sets ``until = now + delay``."""
        self.failures += 1
        self.delay_seconds = self.draw(self.failures)
        if now is not None:
            self.until = now + self.delay_seconds
        return self.delay_seconds

    def reset(self) -> None:
        """A success (or news that the other side is back): the next failure starts over at
        ``base_seconds`` and no deadline is pending."""
        self.failures = 0
        self.delay_seconds = 0.0
        self.until = 0.0

    def waiting(self, now: float) -> bool:
        """True while ``now`` is before the deadline the last ``failed(now)`` set."""
        return now < self.until

    def remaining(self, now: float) -> float:
        """Seconds from ``now`` until the deadline, 0 when none is pending."""
        return max(0.0, self.until - now)

    async def sleep(self, sleep: Callable[[float], Awaitable[object]] = asyncio.sleep) -> float:
        """Count a failure and sleep its delay with ``sleep`` (asyncio.sleep, or an injected
        virtual-time sleep); returns the delay slept. Cancelling the awaiting task cancels the
        sleep (CancelledError propagates); the failure stays counted."""
        delay = self.failed()
        await sleep(delay)
        return delay


async def every(
    iteration: Callable[[], Awaitable[object]],
    interval_seconds: float,
    *,
    what: str,
    log: logging.Logger,
    rng: random.Random | None = None,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
) -> NoReturn:
    """Forever: await ``iteration()``, then pause ``interval_seconds``.

    An iteration that raises ``Exception`` is logged at ERROR with its traceback, naming
    ``what``, and the pause after it is ``max(interval_seconds, delay)``, the delay of a
    ``Backoff`` starting at the interval with equal jitter and capped at ``ERROR_CAP_SECONDS``;
    the next iteration that returns resets it. ``BaseException`` (cancellation included)
    propagates: cancelling the task ends the loop, during an iteration or a pause.
    """
    backoff = Backoff(interval_seconds, ERROR_CAP_SECONDS, jitter=0.5, rng=rng)
    while True:
        try:
            await iteration()
        except Exception:
            pause = max(interval_seconds, backoff.failed())
            log.exception(
                "%s failed (%d in a row); retrying in %.1fs", what, backoff.failures, pause
            )
        else:
            backoff.reset()
            pause = interval_seconds
        await sleep(pause)
