"""Outbox queries of the metadata index: the pending messages of one peer, their deletion once
delivered, and the depth of every peer's queue. A mixin of ``storage.index.MetadataIndex``,
with the same rules: blocking, one connection per thread, deletes on the writer thread only.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable

from kura.storage.outbox import OutboxMessage
from kura.storage.schema import rollback as _rollback


class OutboxQueries:
    """The outbox part of ``MetadataIndex`` (``_conn`` is the index's per-thread connection)."""

    def _conn(self) -> sqlite3.Connection:
        raise NotImplementedError

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

    def outbox_delete(self, ids: Iterable[int]) -> int:
        """Delete delivered messages; returns how many. 0 when the disk is full (SQLITE_FULL):
        the messages stay and are delivered again, which peers apply idempotently (LWW)."""
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            cur = conn.executemany("DELETE FROM outbox WHERE id = ?", ((i,) for i in ids))
            conn.execute("COMMIT")
            return cur.rowcount
        except sqlite3.OperationalError as exc:
            _rollback(conn)
            if exc.sqlite_errorname != "SQLITE_FULL":
                raise
            return 0
        except BaseException:
            _rollback(conn)
            raise

    def outbox_depths(self) -> dict[str, tuple[int, int]]:
        """{peer: (pending messages, enqueue time in ms of the oldest)}."""
        rows = (
            self._conn()
            .execute("SELECT peer, COUNT(*), MIN(enqueued_at_ms) FROM outbox GROUP BY peer")
            .fetchall()
        )
        return {str(r[0]): (int(r[1]), int(r[2])) for r in rows}
