"""The ports the layers above storage depend on: small ``typing.Protocol``s that the mesh, the
API and the gRPC services type against instead of the concrete ``CacheService``. Each is
implemented inside ``kura.storage``; this module holds no SQL and no state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from kura.storage.outbox import CatchUpMark, ChangesPage, OutboxMessage, PeerCursor, RangeDigests


class PeerQueueView(Protocol):
    """The per-peer outbox queues and catch-up marks as this process sees them now
    (``storage.peer_queue.PeerQueues``). Readable on the event loop at any time: the mappings
    are replaced, never changed in place."""

    @property
    def max_depth_per_peer(self) -> int:
        """``KURA_OUTBOX_MAX_DEPTH``: messages a peer's queue may hold before it is marked."""
        ...

    @property
    def depths(self) -> Mapping[str, int]:
        """Peer URL -> messages queued for it (peers never queued for are absent)."""
        ...

    @property
    def marks(self) -> Mapping[str, CatchUpMark]:
        """Peer URL -> its durable catch-up mark."""
        ...

    @property
    def skipped_total(self) -> Mapping[str, int]:
        """Peer URL -> messages not enqueued for it at its cap since this process started."""
        ...

    def depth(self, peer: str) -> int:
        """Messages queued for ``peer`` (0 if none)."""
        ...


class ReplicaLog(Protocol):
    """This node's replication state as the mesh reads and changes it: each peer's outbox
    queue, its catch-up mark, this node's change feed, the cursors into peers' feeds and the
    anti-entropy range digests. Implemented over the metadata index by
    ``storage.replica_log.IndexReplicaLog``.

    Every method is safe to call concurrently from the event loop; none blocks it. A method
    that changes something has made it durable when it returns (``docs/durability.md``)."""

    @property
    def queues(self) -> PeerQueueView:
        """The queues and marks in memory, for decisions on the event loop."""
        ...

    async def outbox_batch(self, peer: str, limit: int) -> list[OutboxMessage]:
        """The oldest ``limit`` messages queued for ``peer``, oldest first; empty while the
        index is read-only. Never held back by a full disk (issue 26: a delivery is what makes
        an artifact pending upload evictable)."""
        ...

    async def outbox_ack(self, ids: Sequence[int]) -> int:
        """Delete delivered messages (only once the peer acknowledged them); the number
        deleted, fewer than ``len(ids)`` (0) when the disk is too full to record it: they are
        delivered again later, which peers apply idempotently (last writer wins). Evicts down
        to ``KURA_MAX_DISK_BYTES`` at once when a delivery left the store over it."""
        ...

    async def outbox_depths(self) -> dict[str, tuple[int, int]]:
        """Peer URL -> (messages queued, enqueue time in Unix ms of the oldest), from the
        index; peers with an empty queue are absent."""
        ...

    async def changes_page(self, since: int, limit: int) -> ChangesPage:
        """This node's change feed after change number ``since`` (>= 0), at most ``limit``
        (>= 1) rows, one snapshot (``storage.change_feed``). ``Unavailable`` (503) on an index
        without the change sequence (read-only, written before schema version 3)."""
        ...

    async def load_cursor(self, peer: str) -> PeerCursor | None:
        """How far this node has applied ``peer``'s feed; None if never (or an index without
        cursors)."""
        ...

    async def store_cursor(self, peer: str, epoch: str, seq: int) -> None:
        """Record that ``peer``'s feed of ``epoch`` is applied up to ``seq``. ``Unavailable``
        when it cannot be written (a read-only index, a full disk)."""
        ...

    async def range_digests(self, prefix: str, depth: int) -> RangeDigests:
        """The digests of the ranges ``depth`` hex digits below the hex ``prefix`` (``depth``
        0: the range itself) and of the tombstones. ``ValueError`` unless ``len(prefix) +
        depth`` is one of ``DIGEST_LEVELS``; ``Unavailable`` on an index without digests."""
        ...

    async def forget_peer(self, peer: str) -> tuple[int, int]:
        """Drop ``peer``'s whole queue and mark it absent, in one transaction (it was away for
        ``KURA_PEER_FORGET_AFTER``). Returns (messages dropped, this node's change feed head
        right after)."""
        ...

    async def reoffer_tombstones(self, peer: str, since_ms: int) -> int:
        """Enqueue for ``peer`` every namespace tombstone at or above version ``since_ms``, in
        one transaction; how many."""
        ...

    async def reoffer_artifacts(
        self, peer: str, since_ms: int, after: str, limit: int
    ) -> tuple[int, str]:
        """Enqueue for ``peer`` the next ``limit`` artifacts (artifact_id order, strictly
        after ``after``; ``""``: from the first) at or above version ``since_ms``, in one
        transaction. Returns (how many, the last artifact_id or ``after``); fewer than
        ``limit``: the pass is complete."""
        ...

    async def clear_mark(self, peer: str, skipped_at_start: int) -> bool:
        """Remove ``peer``'s catch-up mark, unless messages were skipped for it since
        ``queues.skipped_total[peer]`` was ``skipped_at_start``: then False (catch up again)."""
        ...
