"""The end of a peer's outbox queue, and the peer's catch-up by pulling this node's change feed
(issue 11, deliverable 1; issue 27: one way to catch up).

Rules, checked every ``interval_seconds``:

* A peer (a replication target, a peer with queued messages or one marked) whose queue reached
  ``KURA_OUTBOX_MAX_DEPTH`` (the write path then skips it and marks it ``overflow``:
  ``PeerQueues.admit``), or that membership has not seen healthy for ``forget_after_seconds``
  (``KURA_PEER_FORGET_AFTER``), loses its whole queue in one writer-thread transaction and is
  marked, durably, to be caught up (``OutboxLog.forget_peer``): logged at WARNING, counted
  (``dropped_queues_total``, ``dropped_messages_total``) and shown in ``/status``. While it is
  not seen healthy, local writes are not enqueued for it (``targets``): the mark covers them.
* A marked peer seen healthy is told to pull: ``POST /_internal/changes/pull`` naming this node
  (``ask_to_pull``, ``kura.api.changes``) makes it pull our change feed from its durable cursor
  now (``mesh.incremental``). The feed does not carry purges of a writer's entries
  (provenance): once told, the peer is re-offered those since its mark through its queue
  (``OutboxLog.reoffer_purges``). A failed request is retried at the next check. A peer that was
  down pulls when it returns anyway (its start-up pass, or the pass ``kura.app`` starts when it
  sees this node healthy again), and every kura polls its peers' feeds
  (``KURA_CHANGES_POLL_INTERVAL``).
* ``feed_read`` sees those pulls (``GET /_internal/changes`` with ``Kura-Node``) and clears the
  mark once the peer has pulled from a ``since`` at or below our head at the time we marked it
  (or, after a full bootstrap, from the head it read when that began, or from the head of an
  earlier such pull) through consecutive pages to our head: by the puller's cursor rule it then
  holds every change up to that head. Every later write must reach it through the outbox, so a
  forgotten peer must also be seen healthy by membership before and after the last page (until
  then ``targets`` leaves it out), and no message may have been skipped at its cap during the
  pull. Logged and counted (``catch_ups_total``).
* The one case that stays a push: a marked peer seen healthy that no pull will catch up is
  re-offered, through its queue, every namespace tombstone at or above its mark's ``since_ms``
  (``OutboxLog.reoffer_tombstones``; few, one per cleaned namespace, applied idempotently),
  and its mark is cleared if it is still healthy and nothing was skipped for it meanwhile
  (else the next check re-offers again). Without it, a clean it missed would never reach it
  and it would keep serving the cleaned namespace from its disk: anti-entropy cannot help, a
  node runs it only against the peers it pulls from. Two such peers:

  * with the object-storage tier (``object_tier``) every marked peer, at once: no feed pass
    and no anti-entropy run there (the pull route answers 404) and the outbox carries only
    cleans (bodies are in the bucket);
  * otherwise, a peer that has not pulled within ``pull_grace_seconds`` of being seen healthy
    (one that does not list this node as a peer, so it answers the pull request 404 and never
    polls our feed), after one WARNING. The artifacts it missed are left to read-through.

Event-loop confined; every read and change of the queues and marks goes through the
``OutboxLog`` port (``storage.ports``), which runs it on the storage writer thread.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from kit.backoff import every
from kit.clock import Clock
from kura.core.object_layout import OUTBOX_TARGET
from kura.mesh.client import PeerError
from kura.mesh.membership import Membership
from kura.storage.outbox import ChangesPage
from kura.storage.ports import OutboxLog, PeerQueueView

log = logging.getLogger(__name__)

# How long a marked peer seen healthy has to pull our change feed before the WARNING and the
# re-offer of its missed tombstones. A kura told to pull (or returning) pulls at once.
PULL_GRACE_SECONDS = 30.0
ASK_TIMEOUT_SECONDS = 2.0


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
    catch_ups_total: dict[str, int] = field(default_factory=dict)

    @staticmethod
    def add(counts: dict[str, int], peer: str, n: int = 1) -> None:
        counts[peer] = counts.get(peer, 0) + n


class CatchUp:
    """See module docstring. Run ``run()`` in the node's TaskGroup. ``ask_to_pull(peer)`` tells
    ``peer`` to pull our change feed now (raises ``PeerError`` or ``TimeoutError``).
    ``object_tier``: this node shares a bucket, so marked peers are re-offered tombstones
    instead; ``wake_shipper()`` is called after each re-offer and each dropped queue."""

    def __init__(
        self,
        replica_log: OutboxLog,
        membership: Membership,
        clock: Clock,
        forget_after_seconds: float,
        ask_to_pull: Callable[[str], Awaitable[None]],
        interval_seconds: float | None = None,
        pull_grace_seconds: float = PULL_GRACE_SECONDS,
        *,
        object_tier: bool = False,
        wake_shipper: Callable[[], None] = lambda: None,
    ) -> None:
        self._object_tier = object_tier
        self._wake_shipper = wake_shipper
        self._log = replica_log
        self._queues: PeerQueueView = replica_log.queues
        self._membership = membership
        self._clock = clock
        self.forget_after_seconds = forget_after_seconds
        self._ask_to_pull = ask_to_pull
        self._interval = interval_seconds or max(0.5, min(5.0, forget_after_seconds / 4))
        # peer -> monotonic seconds since when it has not been seen healthy
        self._absent_since: dict[str, float] = {}
        self.stats = CatchUpStats()
        self._pull_grace = pull_grace_seconds
        # peer -> monotonic seconds when this check first saw it healthy while marked
        self._returned_at: dict[str, float] = {}
        self._asked: set[str] = set()  # told to pull since it was last seen healthy
        self._warned: set[str] = set()  # past its grace (the WARNING, once while it stays)
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
        """``peer`` is pulling our change feed (a page read, more to come)."""
        return peer in self._pulls

    async def run(self) -> None:
        """Forever: drop the queues of peers at their cap or absent too long, tell marked
        peers that are back to pull."""
        await every(self.check_once, self._interval, what="outbox end-of-life check", log=log)

    async def check_once(self) -> None:
        healthy = set(self._membership.healthy_peers())
        now = self._clock.monotonic()
        cap = self._queues.max_depth_per_peer
        marks = self._queues.marks
        for peer in sorted(set(self._membership.targets()) | set(self._queues.depths) | set(marks)):
            if peer == OUTBOX_TARGET:
                continue  # the object tier's upload queue is never forgotten
            depth = self._queues.depth(peer)
            if peer in healthy:
                self._absent_since.pop(peer, None)
                if depth >= cap:
                    await self._forget(peer, f"reached KURA_OUTBOX_MAX_DEPTH={cap}")
                if peer in self._queues.marks and self._object_tier:
                    await self._reoffer_tombstones(peer)
                elif peer in self._queues.marks:
                    await self._ask(peer, now)
                else:
                    self._returned_at.pop(peer, None)
                continue
            self._returned_at.pop(peer, None)
            self._asked.discard(peer)  # told again when it returns
            self._warned.discard(peer)  # and given its grace again
            absent = now - self._absent_since.setdefault(peer, now)
            mark = marks.get(peer)
            forgotten = mark is not None and mark.forgotten_at_ms is not None
            if depth >= cap:
                await self._forget(peer, f"reached KURA_OUTBOX_MAX_DEPTH={cap}")
            elif absent >= self.forget_after_seconds and not (forgotten and depth == 0):
                why = f"absent for {absent:.0f}s (KURA_PEER_FORGET_AFTER={self.forget_after_seconds:.0f}s)"
                await self._forget(peer, why)

    async def _forget(self, peer: str, why: str) -> None:
        dropped, self._seq_at_mark[peer] = await self._log.forget_peer(peer)
        self._wake_shipper()  # its queue gauges show the drop now, not at its next refresh
        self.stats.add(self.stats.dropped_queues_total, peer)
        self.stats.add(self.stats.dropped_messages_total, peer, dropped)
        log.warning(
            "outbox: peer %s %s: dropped its queue of %d messages; it is marked to be caught up "
            "by %s",
            peer,
            why,
            dropped,
            "our re-offer of its missed tombstones"
            if self._object_tier
            else "pulling our change feed",
        )

    async def _reoffer_tombstones(self, peer: str) -> None:
        """``peer`` is marked and healthy, and no pull will catch it up (the object-storage
        tier, or a peer past its grace): re-offer it the tombstones since its mark, then clear
        the mark (module docstring)."""
        since_ms = self._queues.marks[peer].since_ms
        skipped = self._queues.skipped_total.get(peer, 0)
        sent = await self._log.reoffer_tombstones(peer, since_ms)
        self._wake_shipper()
        if peer not in self._membership.healthy_peers():
            return  # a clean in between may have left it out: re-offered when it returns
        if await self._log.clear_mark(peer, skipped):
            self._seq_at_mark.pop(peer, None)
            self._full_walk_head.pop(peer, None)
            self._warned.discard(peer)
            self.stats.add(self.stats.catch_ups_total, peer)
            log.info(
                "outbox: %s caught up by re-offering %d namespace tombstones at or above "
                "version %d; mark cleared",
                peer,
                sent,
                since_ms,
            )

    async def _ask(self, peer: str, now: float) -> None:
        """``peer`` is marked and healthy: tell it to pull; past the grace, re-offer it the
        tombstones since its mark (module docstring)."""
        returned = self._returned_at.setdefault(peer, now)
        if now - returned >= self._pull_grace:
            if peer not in self._warned:
                self._warned.add(peer)
                log.warning(
                    "outbox: %s is marked to be caught up but has not pulled our change feed "
                    "%.0fs after it was seen healthy (it does not list this node as a peer, or "
                    "answered no pull request): re-offering it the namespace tombstones since "
                    "its mark; the artifacts it missed are left to read-through",
                    peer,
                    now - returned,
                )
            await self._reoffer_tombstones(peer)
            return
        if peer in self._asked:
            return
        try:
            async with asyncio.timeout(ASK_TIMEOUT_SECONDS):
                await self._ask_to_pull(peer)
        except (PeerError, TimeoutError) as exc:
            log.info("outbox: could not tell %s to pull (retried next check): %s", peer, exc)
            return
        self._asked.add(peer)
        # The feed carries tombstones, not purges of a writer's entries: those it missed go
        # through its queue (few, applied idempotently).
        since_ms = self._queues.marks[peer].since_ms
        if sent := await self._log.reoffer_purges(peer, since_ms):
            self._wake_shipper()
            log.info("outbox: re-offered %s %d purges at or above version %d", peer, sent, since_ms)
        log.info("outbox: told %s to pull our change feed", peer)

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
        # It pulls: if the mark stays, it is told again and its grace starts over.
        self._asked.discard(peer)
        self._returned_at.pop(peer, None)
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
            self._warned.discard(peer)
            self.stats.add(self.stats.catch_ups_total, peer)
            log.info(
                "outbox: %s caught up by pulling our change feed from %d to %d; mark cleared",
                peer,
                pull.first_since,
                page.head_seq,
            )
