"""The end of a peer's outbox queue, and the catch-up when the peer returns (issue 11,
deliverable 1).

Rules, checked every ``interval_seconds``:

* A peer (a replication target, a peer with queued messages or one marked) that membership has
  not seen healthy for ``forget_after_seconds`` (``KURA_PEER_FORGET_AFTER``) loses its whole
  queue in one writer-thread transaction and is marked, durably, to be caught up
  (``PeerQueues.forget``): logged at WARNING, counted (``dropped_queues_total``,
  ``dropped_messages_total``) and shown in ``/status``. While it stays absent, local writes are
  not enqueued for it (``targets``): the mark covers them.
* A peer whose queue reached ``KURA_OUTBOX_MAX_DEPTH`` is marked by the write path itself
  (``PeerQueues.admit``); writes go on.
* A marked peer seen healthy is caught up. Interim rule, until incremental catch-up and
  anti-entropy (issue 11, deliverables 2 and 3) replace it: this node re-offers, for that peer,
  every tombstone and artifact it holds at or above the mark's ``since_ms``, in pages of at most
  ``PAGE`` rows, each one short writer-thread transaction, and only while that peer's queue is
  below half its cap, so a local write waits for one page at most and the peer's queue never
  reaches the cap because of the catch-up. Then the mark is cleared (unless messages were
  skipped meanwhile: then the pass runs again). Started and finished passes are logged and
  counted (``reoffered_total``, ``catch_ups_total``). A restart mid-pass starts it again (the
  mark is durable; re-offers are idempotent on the peer, last writer wins).

Event-loop confined, except what runs through ``CacheService.in_writer``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from kit.clock import Clock
from kura.mesh.membership import Membership
from kura.storage.peer_queue import PeerQueues
from kura.storage.service import CacheService

log = logging.getLogger(__name__)

PAGE = 256
DRAIN_POLL_SECONDS = 0.2


@dataclass
class CatchUpStats:
    """Counters by peer URL, read by metrics."""

    dropped_queues_total: dict[str, int] = field(default_factory=dict)
    dropped_messages_total: dict[str, int] = field(default_factory=dict)
    reoffered_total: dict[str, int] = field(default_factory=dict)
    catch_ups_total: dict[str, int] = field(default_factory=dict)

    @staticmethod
    def add(counts: dict[str, int], peer: str, n: int = 1) -> None:
        counts[peer] = counts.get(peer, 0) + n


class CatchUp:
    """See module docstring. Run ``run()`` in the node's TaskGroup."""

    def __init__(
        self,
        service: CacheService,
        membership: Membership,
        clock: Clock,
        forget_after_seconds: float,
        wake_shipper: Callable[[], None],
        interval_seconds: float | None = None,
    ) -> None:
        self._service = service
        self._queues: PeerQueues = service.queues
        self._membership = membership
        self._clock = clock
        self.forget_after_seconds = forget_after_seconds
        self._wake_shipper = wake_shipper
        self._interval = interval_seconds or max(0.5, min(5.0, forget_after_seconds / 4))
        # peer -> monotonic seconds since when it has not been seen healthy
        self._absent_since: dict[str, float] = {}
        self._passes: dict[str, asyncio.Task[None]] = {}
        self.stats = CatchUpStats()

    def targets(self) -> list[str]:
        """The replication targets of a local write: membership's, minus peers forgotten and
        still absent (their mark covers the write)."""
        healthy = set(self._membership.healthy_peers())
        marks = self._queues.marks
        return [
            p
            for p in self._membership.targets()
            if p in healthy or p not in marks or marks[p].forgotten_at_ms is None
        ]

    def catching_up(self, peer: str) -> bool:
        task = self._passes.get(peer)
        return task is not None and not task.done()

    async def run(self) -> None:
        """Forever: forget peers absent too long, catch up marked peers that are back."""
        try:
            while True:
                try:
                    await self.check_once()
                except Exception:
                    log.exception("outbox end-of-life check failed; retrying next interval")
                await asyncio.sleep(self._interval)
        finally:
            for task in self._passes.values():
                task.cancel()
            for task in self._passes.values():
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def check_once(self) -> None:
        healthy = set(self._membership.healthy_peers())
        now = self._clock.monotonic()
        marks = self._queues.marks
        for peer in sorted(set(self._membership.targets()) | set(self._queues.depths) | set(marks)):
            if peer in healthy:
                self._absent_since.pop(peer, None)
                if peer in marks and not self.catching_up(peer):
                    self._passes[peer] = asyncio.create_task(
                        self._catch_up(peer), name=f"catch up {peer}"
                    )
                continue
            since = self._absent_since.setdefault(peer, now)
            mark = marks.get(peer)
            forgotten = mark is not None and mark.forgotten_at_ms is not None
            if now - since < self.forget_after_seconds:
                continue
            if forgotten and self._queues.depth(peer) == 0:
                continue
            await self._forget(peer, now - since)

    async def _forget(self, peer: str, absent_seconds: float) -> None:
        dropped = await self._service.in_writer(self._queues.forget, peer, self._clock.now_ms())
        self.stats.add(self.stats.dropped_queues_total, peer)
        self.stats.add(self.stats.dropped_messages_total, peer, dropped)
        log.warning(
            "outbox: peer %s absent for %.0fs (KURA_PEER_FORGET_AFTER=%.0fs): dropped its queue "
            "of %d messages; it is marked to be caught up when it returns",
            peer,
            absent_seconds,
            self.forget_after_seconds,
            dropped,
        )

    async def _catch_up(self, peer: str) -> None:
        try:
            while (mark := self._queues.marks.get(peer)) is not None:
                skipped = self._queues.skipped_total.get(peer, 0)
                log.info(
                    "outbox: catching up %s (marked %s): re-offering everything at or above "
                    "version %d",
                    peer,
                    mark.reason,
                    mark.since_ms,
                )
                sent = await self._reoffer(peer, mark.since_ms)
                if sent is None:
                    return  # the peer went away again; the next check starts over
                if await self._service.in_writer(self._queues.clear, peer, skipped):
                    self.stats.add(self.stats.catch_ups_total, peer)
                    log.info("outbox: caught up %s: %d messages re-offered", peer, sent)
                    return
        except Exception:
            log.exception("outbox: catch-up of %s failed; the next check retries", peer)

    async def _reoffer(self, peer: str, since_ms: int) -> int | None:
        """One pass; the messages enqueued, or None if the peer stopped being healthy."""
        sent = await self._service.in_writer(
            self._queues.enqueue_tombstones, peer, since_ms, self._clock.now_ms()
        )
        self.stats.add(self.stats.reoffered_total, peer, sent)
        after = ""
        half = max(1, self._queues.max_depth_per_peer // 2)
        while True:
            while self._queues.depth(peer) >= half:
                if peer not in self._membership.healthy_peers():
                    return None
                await asyncio.sleep(DRAIN_POLL_SECONDS)
            limit = min(PAGE, half - self._queues.depth(peer))
            n, after = await self._service.in_writer(
                self._queues.enqueue_artifacts, peer, since_ms, after, limit, self._clock.now_ms()
            )
            sent += n
            self.stats.add(self.stats.reoffered_total, peer, n)
            self._wake_shipper()
            if n < limit:
                return sent
