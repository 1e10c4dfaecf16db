"""Peer body traffic that yields to public load: ``PublicLoad`` (what the public listener is doing
now) and ``PeerPace`` (one node-wide limiter every peer body transfer goes through).

The rule is upstream Kura's (its ``KURA_REPLICATION_PUBLIC_LATENCY_TARGET_MS`` setting, see
https://github.com/tuist/kura, README and docs/architecture.md, "Replication"): peer traffic runs
at ``base / factor`` bytes per second, where

    factor = max(public_inflight + 1, public_latency_ewma / target)

so a quiet node (nothing in flight, latency under the target) keeps the whole base, each public
request in flight takes a share, and public latency above the target slows peer traffic in
proportion. The rate never drops below ``FLOOR_BYTES_PER_SECOND`` (or the base, if lower), so a
bootstrap under constant public load still finishes: ``D`` bytes take at most
``D / FLOOR_BYTES_PER_SECOND`` seconds of pacing.

With worker processes (``kura.workers``) the public load counts every process: each worker
sends its in-flight count and its latency samples to the primary (``kura.mesh.load_report``),
and ``PublicLoad.merge`` adds them (in flight summed, samples fed into the one EWMA).

Both classes are event-loop confined (no locks); every call is O(1), or O(workers) where the
workers' reports are summed. Time comes from a ``kit.clock.Clock`` so tests run on virtual
time.

Paced: the bodies this node serves to peers (``/_internal/bootstrap/artifacts/…`` and
``/_internal/bootstrap/bodies``; in 64 KiB chunks when peers are slowed as the response starts,
else paid whole and sent with ``sendfile``), the bodies of its own bootstrap and anti-entropy
downloads (chunk by chunk as they arrive, so TCP slows the sender) and replication pushes (paid
before they are sent). Not paced: read-through fetches on either side (``Kura-Read-Through: 1``; a
client waits on them), which are also exempt from
``KURA_REPLICATION_BANDWIDTH_LIMIT_BYTES_PER_SECOND``. Pacing only delays bytes of a transfer that
already holds its tmp reservation, so every budget rule holds; a paced download holds its
reservation longer. A target or a base of 0 turns pacing off.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable

from kit.clock import Clock
from kura.mesh.load_report import REMOTE_STALE_SECONDS, LoadReport

MiB = 1024 * 1024
# The lowest rate pacing may impose: 1 MiB/s keeps a 4 MiB artifact under 5 s and a 1 GiB
# bootstrap under 18 min even when public load never stops.
FLOOR_BYTES_PER_SECOND = 1 * MiB
# Weight of each new public request's latency in the EWMA (about the last 10 requests).
EWMA_ALPHA = 0.1
# After this long without a new request (seconds) the EWMA decays toward 0 with the time
# constant IDLE_DECAY_SECONDS: a burst of slow requests followed by silence must not keep a
# quiet node paced, while gaps between ordinary requests do not dilute the average.
IDLE_GRACE_SECONDS = 1.0
IDLE_DECAY_SECONDS = 2.0
# Waits below this are carried to the next chunk instead of slept (a sleep costs more).
MIN_SLEEP_SECONDS = 0.001


class PublicLoad:
    """Public requests in flight and an EWMA of their latency (seconds), of the whole node.

    ``started()`` when a public request of this process begins, ``sample(seconds)`` once its
    response is ready to go out (the latency), ``ended()`` once its body is sent (or it
    failed); ``merge(source, report)`` adds a worker's (``kura.mesh.load_report``).
    ``inflight`` is this process's count, ``inflight_total()`` the node's; ``factor()`` is the
    slowdown of peer traffic (>= 1.0; always 1.0 when ``target_seconds`` is 0)."""

    def __init__(self, clock: Clock, target_seconds: float) -> None:
        self._clock = clock
        self.target_seconds = target_seconds
        self.inflight = 0
        self._ewma = 0.0
        self._sampled_at = clock.monotonic()
        self._remote: dict[str, tuple[int, float]] = {}  # source -> (in flight, reported at)

    def started(self) -> None:
        self.inflight += 1

    def sample(self, latency_seconds: float) -> None:
        self._step(latency_seconds, 1)

    def _step(self, latency_seconds: float, count: int) -> None:
        """``count`` samples of ``latency_seconds`` each, one after the other."""
        now = self._clock.monotonic()
        current = self._ewma
        if now - self._sampled_at > IDLE_GRACE_SECONDS:
            current = self._decayed(now)
        if count == 1:
            self._ewma = current + EWMA_ALPHA * (latency_seconds - current)
        else:
            keep = (1 - EWMA_ALPHA) ** count
            self._ewma = latency_seconds + keep * (current - latency_seconds)
        self._sampled_at = now

    def merge(self, source: str, report: LoadReport) -> None:
        """Add a worker's report: its in flight replaces ``source``'s previous count (for at
        most ``REMOTE_STALE_SECONDS``), its samples enter the EWMA, the older ones first as
        one step of their mean."""
        if report.older_count > 0:
            self._step(report.older_sum / report.older_count, report.older_count)
        for latency in report.recent:
            self._step(latency, 1)
        self._remote[source] = (report.inflight, self._clock.monotonic())

    def forget(self, source: str) -> None:
        """``source`` stopped (a worker exited): its requests no longer count."""
        self._remote.pop(source, None)

    def inflight_total(self) -> int:
        """Public requests in flight on every process: this one's and the workers' reports
        not older than ``REMOTE_STALE_SECONDS``."""
        if not self._remote:
            return self.inflight
        now = self._clock.monotonic()
        remote = sum(n for n, at in self._remote.values() if now - at <= REMOTE_STALE_SECONDS)
        return self.inflight + remote

    def ended(self) -> None:
        self.inflight = max(0, self.inflight - 1)

    def finished(self, latency_seconds: float) -> None:
        """``sample`` then ``ended``: a request whose response was ready and sent at once."""
        self.sample(latency_seconds)
        self.ended()

    def latency_ewma_seconds(self) -> float:
        """The EWMA; once idle past ``IDLE_GRACE_SECONDS``, decayed (``IDLE_DECAY_SECONDS``)."""
        return self._decayed(self._clock.monotonic())

    def _decayed(self, now: float) -> float:
        idle = now - self._sampled_at - IDLE_GRACE_SECONDS
        if idle <= 0:
            return self._ewma
        return self._ewma * math.exp(-idle / IDLE_DECAY_SECONDS)

    def factor(self) -> float:
        if self.target_seconds <= 0:
            return 1.0
        inflight = self.inflight_total()
        return max(float(inflight + 1), self.latency_ewma_seconds() / self.target_seconds)


class PeerPace:
    """The node-wide limiter for peer body bytes: ``await acquire(n)`` before (or after) moving
    ``n`` bytes; transfers share one schedule, so two at once each get about half the rate.

    ``base_bytes_per_second`` 0 (or a ``PublicLoad`` with target 0) turns pacing off:
    ``enabled`` is False and ``acquire`` returns at once."""

    def __init__(
        self,
        base_bytes_per_second: int,
        load: PublicLoad,
        clock: Clock,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:
        self.base_bytes_per_second = base_bytes_per_second
        self.load = load
        self._clock = clock
        self._sleep = sleep
        self._next_free = clock.monotonic()
        self.paced_bytes = 0
        self.waited_seconds = 0.0

    @property
    def enabled(self) -> bool:
        return self.base_bytes_per_second > 0 and self.load.target_seconds > 0

    def rate(self) -> float:
        """Bytes per second allowed now (``math.inf`` when pacing is off)."""
        if not self.enabled:
            return math.inf
        base = float(self.base_bytes_per_second)
        return max(min(float(FLOOR_BYTES_PER_SECOND), base), base / self.load.factor())

    def slowing(self) -> bool:
        """True when public load slows peer traffic right now (factor above 1)."""
        return self.enabled and self.load.factor() > 1.0

    async def acquire(self, nbytes: int) -> None:
        if nbytes <= 0 or not self.enabled:
            return
        now = self._clock.monotonic()
        start = max(self._next_free, now)  # idle time earns no burst
        self._next_free = start + nbytes / self.rate()
        self.paced_bytes += nbytes
        wait = start - now
        if wait >= MIN_SLEEP_SECONDS:
            self.waited_seconds += wait
            await self._sleep(wait)

    async def paced(self, chunks: AsyncIterable[bytes]) -> AsyncIterator[bytes]:
        """``chunks`` passed through, each paid for after it arrived (a receiver reads no
        faster than the rate, and TCP slows the sender to match)."""
        async for chunk in chunks:
            yield chunk
            await self.acquire(len(chunk))
