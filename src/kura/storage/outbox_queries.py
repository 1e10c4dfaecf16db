"""Outbox queries of the metadata index: the pending messages of one peer and the depth of
every peer's queue (deliveries are deleted by ``storage.peer_queue.PeerQueues.acked``). A part
of ``storage.index.MetadataIndex`` (``MetadataIndex.outbox``), with the same rules: blocking, one connection per thread.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from kura.storage.outbox import OutboxMessage


class OutboxQueries:
    """The outbox part of ``MetadataIndex`` (``_conn`` is the index's per-thread connection)."""

    def __init__(self, conn: Callable[[], sqlite3.Connection]) -> None:
        self._conn = conn  # the index's connection of the calling thread

    def outbox_batch(self, peer: str, limit: int) -> list[OutboxMessage]:
        """The oldest ``limit`` messages for ``peer``, oldest first."""
        rows = (
            self._conn()
            .execute(
                "SELECT id, peer, kind, artifact_id, namespace_id, version_ms, enqueued_at_ms "
                "FROM outbox WHERE peer = ? ORDER BY id LIMIT ?",
                (peer, limit),
            )
            .fetchall()
        )
        return [OutboxMessage(*r) for r in rows]

    def outbox_depths(self) -> dict[str, tuple[int, int]]:
        """{peer: (pending messages, enqueue time in ms of the oldest)}."""
        rows = (
            self._conn()
            .execute("SELECT peer, COUNT(*), MIN(enqueued_at_ms) FROM outbox GROUP BY peer")
            .fetchall()
        )
        return {str(r[0]): (int(r[1]), int(r[2])) for r in rows}
