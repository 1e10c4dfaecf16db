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
* A marked peer seen healthy normally catches up by itself: it pulls this node's change feed
  from its durable cursor (``mesh.incremental``, issue 11 deliverable 2). ``feed_read`` sees
  those pulls (``GET /_internal/changes`` with ``Kura-Node``) and clears the mark once the
  peer has pulled from a ``since`` at or below our head at the time we marked it (or, after a
  full bootstrap, from the head it read when that began, or from the head of an earlier such
  pull) through consecutive pages to our head: by the puller's cursor rule it then holds every
  change up to that head. Every later write must reach it through the outbox, so a forgotten
  peer must also be seen healthy by membership before and after the last page (until then
  ``targets`` leaves it out), and no message may have been skipped at its cap during the pull.
  Logged and counted (``catch_ups_total``), nothing re-offered.
* Fallback, for a peer that does not pull within ``pull_grace_seconds`` (it does not list this
  node as a peer, or is an older kura; or its queue only reached the cap, so it never went
  away and has no reason to pull): this node re-offers, for that peer,
  every tombstone and artifact it holds at or above the mark's ``since_ms``, in pages of at most
  ``PAGE`` rows, each one short writer-thread transaction, and only while that peer's queue is
  below half its cap, so a local write waits for one page at most and the peer's queue never
  reaches the cap because of the catch-up. Then the mark is cleared (unless messages were
  skipped meanwhile: then the pass runs again). Started and finished passes are logged and
  counted (``reoffered_total``, ``catch_ups_total``). A restart mid-pass starts it again (the
  mark is durable; re-offers are idempotent on the peer, last writer wins).

Event-loop confined; every read and change of the queues and marks goes through the
``OutboxLog`` port (``storage.ports``), which runs it on the storage writer thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from kit.backoff import every
from kit.clock import Clock
from kura.core.object_layout import OUTBOX_TARGET
from kura.mesh.membership import Membership
from kura.storage.outbox import ChangesPage
from kura.storage.ports import OutboxLog, PeerQueueView

log = logging.getLogger(__name__)

PAGE = 256
DRAIN_POLL_SECONDS = 0.2
# How long a returning marked peer has to pull our change feed before we re-offer instead. A
# returning kura pulls at once (restart, or membership sees us healthy again).
PULL_GRACE_SECONDS = 30.0


@dataclass
class _Pull:
    """A marked peer's pull of our feed in progress: the ``since`` it began from, the one its
    next page must ask for, and the peer's skipped-message count when it began."""

    first_since: int
    next_since: int
    skipped_at_start: int


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
        replica_log: OutboxLog,
        membership: Membership,
        clock: Clock,
        forget_after_seconds: float,
        wake_shipper: Callable[[], None],
        interval_seconds: float | None = None,
        pull_grace_seconds: float = PULL_GRACE_SECONDS,
    ) -> None:
        self._log = replica_log
        self._queues: PeerQueueView = replica_log.queues
        self._membership = membership
        self._clock = clock
        self.forget_after_seconds = forget_after_seconds
        self._wake_shipper = wake_shipper
        self._interval = interval_seconds or max(0.5, min(5.0, forget_after_seconds / 4))
        # peer -> monotonic seconds since when it has not been seen healthy
        self._absent_since: dict[str, float] = {}
        self._passes: dict[str, asyncio.Task[None]] = {}
        self.stats = CatchUpStats()
        self._pull_grace = pull_grace_seconds
        # peer -> monotonic seconds when this check first saw it healthy while marked
        self._returned_at: dict[str, float] = {}
        # peer -> our head seq when we marked it (or first saw its mark), the full-walk head it
        # read, and its pull in progress (feed_read)
        self._seq_at_mark: dict[str, int] = {}
        self._full_walk_head: dict[str, int] = {}
        self._pulls: dict[str, _Pull] = {}

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
            await every(self.check_once, self._interval, what="outbox end-of-life check", log=log)
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
            if peer == OUTBOX_TARGET:
                continue  # the object tier's upload queue is never forgotten
            if peer in healthy:
                self._absent_since.pop(peer, None)
                if peer not in marks:
                    self._returned_at.pop(peer, None)
                    continue
                returned = self._returned_at.setdefault(peer, now)
                if now - returned < self._pull_grace:
                    continue  # it pulls our change feed by itself (feed_read clears the mark)
                if not self.catching_up(peer):
                    self._passes[peer] = asyncio.create_task(
                        self._catch_up(peer), name=f"catch up {peer}"
                    )
                continue
            self._returned_at.pop(peer, None)
            since = self._absent_since.setdefault(peer, now)
            mark = marks.get(peer)
            forgotten = mark is not None and mark.forgotten_at_ms is not None
            if now - since < self.forget_after_seconds:
                continue
            if forgotten and self._queues.depth(peer) == 0:
                continue
            await self._forget(peer, now - since)

    async def _forget(self, peer: str, absent_seconds: float) -> None:
        dropped, self._seq_at_mark[peer] = await self._log.forget_peer(peer)
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

    def feed_read(self, peer: str) -> Callable[[int, ChangesPage], Awaitable[None]]:
        """``peer`` is about to read a page of our change feed (``kura.api.changes``); await
        the returned callable with the ``since`` it asked for and the page it got. Clears its
        mark when the pull qualifies (module docstring). Safe for any peer name: one without a
        mark changes nothing."""
        healthy_before = peer in self._membership.healthy_peers()

        async def read(since: int, page: ChangesPage) -> None:
            await self._feed_read(peer, since, page, healthy_before)

        return read

    async def _feed_read(
        self, peer: str, since: int, page: ChangesPage, healthy_before: bool
    ) -> None:
        mark = self._queues.marks.get(peer)
        if mark is None:
            self._pulls.pop(peer, None)
            return
        threshold = self._seq_at_mark.setdefault(peer, page.head_seq)
        if since == 0:
            # The head read that starts its full bootstrap; a pull from this head follows it.
            self._full_walk_head[peer] = page.head_seq
        pull = self._pulls.pop(peer, None)
        if pull is None or pull.next_since != since:
            if since > max(threshold, self._full_walk_head.get(peer, -1)):
                return
            pull = _Pull(since, since, self._queues.skipped_total.get(peer, 0))
        if page.more:
            pull.next_since = page.next_since
            self._pulls[peer] = pull
            return
        if mark.forgotten_at_ms is not None and not (
            healthy_before and peer in self._membership.healthy_peers()
        ):
            # Forgotten and not seen healthy here: a write after this head was not enqueued
            # for it (``targets``). It holds everything up to this head, so its next pull,
            # from here, qualifies.
            self._seq_at_mark[peer] = max(threshold, page.head_seq)
            return
        # Every later write is now enqueued for it, or skipped at its cap and counted (clear()
        # then refuses, and the pass is judged again).
        if await self._log.clear_mark(peer, pull.skipped_at_start):
            self._seq_at_mark.pop(peer, None)
            self._full_walk_head.pop(peer, None)
            self.stats.add(self.stats.catch_ups_total, peer)
            log.info(
                "outbox: %s caught up by pulling our change feed from %d to %d; mark cleared",
                peer,
                pull.first_since,
                page.head_seq,
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
                if await self._log.clear_mark(peer, skipped):
                    self.stats.add(self.stats.catch_ups_total, peer)
                    log.info("outbox: caught up %s: %d messages re-offered", peer, sent)
                    return
        except Exception:
            log.exception("outbox: catch-up of %s failed; the next check retries", peer)

    async def _reoffer(self, peer: str, since_ms: int) -> int | None:
        """One pass; the messages enqueued, or None if the peer stopped being healthy."""
        sent = await self._log.reoffer_tombstones(peer, since_ms)
        self.stats.add(self.stats.reoffered_total, peer, sent)
        after = ""
        half = max(1, self._queues.max_depth_per_peer // 2)
        while True:
            while self._queues.depth(peer) >= half:
                if peer not in self._membership.healthy_peers():
                    return None
                await asyncio.sleep(DRAIN_POLL_SECONDS)
            limit = min(PAGE, half - self._queues.depth(peer))
            n, after = await self._log.reoffer_artifacts(peer, since_ms, after, limit)
            sent += n
            self.stats.add(self.stats.reoffered_total, peer, n)
            self._wake_shipper()
            if n < limit:
                return sent
