"""``IndexReplicaLog``: the ``storage.ports.OutboxLog`` and ``ChangeLog`` ports over the metadata
index, so the mesh and the API never hold a SQLite connection. One object implements both: they
share the index, its reader pool and its writer thread; each consumer types against the one it
uses.

It is composed from parts of the storage core that ``CacheService`` builds (the index, the
reader pool, the group-commit writer, the peer queues, the clock) and adds no state of its own.
Reads (outbox batches and depths, feed pages, range digests) run in the reader pool; every
change, and the cursor read that precedes one, on the single writer thread, whose group is
durable before the job returns (``storage.group_commit``): the same threads the mesh used when
it ran these queries itself, so nothing about ordering or durability changed.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Executor
from typing import Concatenate, ParamSpec, TypeVar

from kit.clock import Clock
from kura.core.errors import Unavailable
from kura.storage import change_feed, digests
from kura.storage.index import MetadataIndex
from kura.storage.outbox import ChangesPage, OutboxMessage, PeerCursor, RangeDigests
from kura.storage.peer_queue import PeerQueues

P = ParamSpec("P")
T = TypeVar("T")


class IndexReplicaLog:
    """See module docstring. ``index()`` is the open index (it raises before ``start``);
    ``evict_to_budget()`` runs on the writer thread after a delivery was recorded."""

    def __init__(
        self,
        *,
        index: Callable[[], MetadataIndex],
        reader: Executor,
        writer: Executor,
        queues: PeerQueues,
        clock: Clock,
        evict_to_budget: Callable[[], None],
        reads_open: Callable[[], Awaitable[None]],
    ) -> None:
        self._index = index
        self._reads_open = reads_open
        self._reader = reader
        self._writer = writer
        self._queues = queues
        self._clock = clock
        self._evict_to_budget = evict_to_budget

    @property
    def queues(self) -> PeerQueues:
        return self._queues

    async def _on(
        self,
        pool: Executor,
        fn: Callable[Concatenate[sqlite3.Connection, P], T],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """``fn(connection, *args)`` in ``pool``, with that thread's index connection."""
        index = self._index()
        return await self._run(pool, lambda: fn(index.connection(), *args, **kwargs))

    async def _run(self, pool: Executor, fn: Callable[..., T], *args: object) -> T:
        if pool is self._reader:  # start-up's index check: wait here, not in a reader thread
            await self._reads_open()
        return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)

    # -- outbox ------------------------------------------------------------------------------

    async def outbox_batch(self, peer: str, limit: int) -> list[OutboxMessage]:
        index = self._index()
        if index.read_only:
            return []
        return await self._run(self._reader, index.outbox.outbox_batch, peer, limit)

    async def outbox_ack(self, ids: Sequence[int]) -> int:
        if not ids:
            return 0
        return await self._on(self._writer, self._ack_sync, ids)

    def _ack_sync(self, conn: sqlite3.Connection, ids: Sequence[int]) -> int:
        # Writer thread, like every other change of ``stats.outbox_depth``: ``+=``/``-=`` from
        # two threads could lose an update. Uploads to the object-storage tier make their
        # artifacts evictable, so a store over its budget (writes kept while the object store
        # was down) evicts now, not at the next write, which a full disk would refuse first.
        removed = self._queues.acked(conn, ids)
        if removed:
            self._evict_to_budget()
        return removed

    async def outbox_depths(self) -> dict[str, tuple[int, int]]:
        return await self._run(self._reader, self._index().outbox.outbox_depths)

    # -- the change feed and cursors -----------------------------------------------------------

    async def changes_page(self, since: int, limit: int) -> ChangesPage:
        try:
            return await self._on(self._reader, change_feed.read_page, since, limit)
        except change_feed.FeedUnavailable as exc:
            raise Unavailable(str(exc)) from exc

    async def load_cursor(self, peer: str) -> PeerCursor | None:
        return await self._on(self._writer, change_feed.load_cursor, peer)

    async def store_cursor(self, peer: str, epoch: str, seq: int) -> None:
        now_ms = self._clock.now_ms()
        await self._on(self._writer, change_feed.store_cursor, peer, epoch, seq, now_ms)

    # -- anti-entropy ----------------------------------------------------------------------------

    async def range_digests(self, prefix: str, depth: int) -> RangeDigests:
        if not self._index().digests_ready:  # a full disk at start-up (recovery.check_index)
            raise Unavailable("range digests not built yet (the disk was full); try later")
        return await self._on(self._reader, _range_digests_sync, prefix, depth)

    # -- end of life and catch-up ----------------------------------------------------------------

    async def forget_peer(self, peer: str) -> tuple[int, int]:
        return await self._on(self._writer, self._forget_sync, peer, self._clock.now_ms())

    def _forget_sync(self, conn: sqlite3.Connection, peer: str, now_ms: int) -> tuple[int, int]:
        dropped = self._queues.forget(conn, peer, now_ms)
        return dropped, change_feed.head(conn)[1]

    async def reoffer_tombstones(self, peer: str, since_ms: int) -> int:
        now_ms = self._clock.now_ms()
        return await self._on(self._writer, self._queues.enqueue_tombstones, peer, since_ms, now_ms)

    async def reoffer_purges(self, peer: str, since_ms: int) -> int:
        now_ms = self._clock.now_ms()
        return await self._on(
            self._writer, self._queues.enqueue_tombstones, peer, since_ms, now_ms, tombstones=False
        )

    async def clear_mark(self, peer: str, skipped_at_start: int) -> bool:
        return await self._on(self._writer, self._queues.clear, peer, skipped_at_start)


def _range_digests_sync(conn: sqlite3.Connection, prefix: str, depth: int) -> RangeDigests:
    ranges = digests.ranges(conn, prefix, depth)
    count, acc = digests.tombstones_digest(conn)
    return RangeDigests(
        ranges=[(p, n, digests.hex64(h)) for p, n, h in ranges],
        tombstones=(count, digests.hex64(acc)),
    )
