"""Per-peer outbox accounting and the durable "to be caught up" marks (issue 11, deliverable 1).

Each peer's outbox queue is capped on its own (``max_depth_per_peer``, ``KURA_OUTBOX_MAX_DEPTH``):
a peer at its cap gets no more messages, and is *marked* to be caught up instead, so a write is
never refused because of a peer (one dead peer used to shed every write once the messages of
all peers together reached the cap). A peer absent too long loses its whole queue (``forget``)
and is marked too. The mark lives in the ``catch_up`` table of the index, so it survives a
restart:

* ``since_ms``: every artifact and tombstone at or above this version may be missing on the
  peer (the oldest message dropped or never enqueued; a version is never below the wall-clock
  time of its write, ``core.version``).
* ``forgotten_at_ms``: when its queue was dropped (``forget``; None: not dropped yet).

A marked peer is caught up by pulling this node's change feed, which clears the mark
(``clear``, refused if anything was skipped for that peer while it pulled); ``kura.mesh.catch_up``
holds the rules. A peer whose queue reached the cap also loses it (``forget``), from there. With
the object-storage tier, where no pull runs, the tombstones at or above ``since_ms`` are
re-offered through its queue instead (``enqueue_tombstones``).

Every method that changes rows or counters runs on the storage writer thread (the caller passes
that thread's connection), like every other change of ``StorageStats.outbox_depth``, which stays
the exact number of outbox rows. ``marks`` and ``depths`` are replaced, never mutated in place,
so the event loop may read them at any time.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

from kura.core.errors import ResourceExhausted
from kura.core.object_layout import OUTBOX_TARGET
from kura.storage.outbox import DELETE_NAMESPACE, PURGE_WRITER, CatchUpMark
from kura.storage.schema import write_transaction

SCHEMA = """
CREATE TABLE IF NOT EXISTS catch_up (
    peer             TEXT PRIMARY KEY,
    reason           TEXT NOT NULL,
    marked_at_ms     INTEGER NOT NULL,
    since_ms         INTEGER NOT NULL,
    forgotten_at_ms  INTEGER,
    dropped_messages INTEGER NOT NULL DEFAULT 0
);
"""

# Why a peer is marked (a closed set): its queue reached the cap, or it was absent too long.
OVERFLOW = "overflow"
ABSENT = "absent"
# A message skipped at the cap was for a write whose version was issued a moment before the
# check; ``since_ms`` a second earlier covers it.
SINCE_MARGIN_MS = 1000


class DepthGauge(Protocol):
    outbox_depth: int


class PeerQueues:
    """See module docstring. ``gauge()`` is the service's current stats (the object holding
    ``outbox_depth``); ``load`` on the writer thread."""

    def __init__(self, gauge: Callable[[], DepthGauge], max_depth_per_peer: int) -> None:
        self._gauge = gauge
        self.max_depth_per_peer = max_depth_per_peer
        self.depths: dict[str, int] = {}
        self.marks: dict[str, CatchUpMark] = {}
        # peer -> messages not enqueued because its queue was at the cap (since start).
        self.skipped_total: dict[str, int] = {}

    def depth(self, peer: str) -> int:
        return self.depths.get(peer, 0)

    def load(self, conn: sqlite3.Connection, read_only: bool) -> None:
        """Writer thread, at start-up: create the table, read the depths and the marks."""
        if not read_only:
            conn.executescript(SCHEMA)
        self.depths = {
            str(peer): int(n)
            for peer, n in conn.execute("SELECT peer, COUNT(*) FROM outbox GROUP BY peer")
        }
        self._gauge().outbox_depth = sum(self.depths.values())
        try:
            rows = conn.execute(
                "SELECT peer, reason, marked_at_ms, since_ms, forgotten_at_ms, dropped_messages "
                "FROM catch_up"
            ).fetchall()
        except sqlite3.OperationalError:  # read-only index written by an older kura
            rows = []
        self.marks = {str(r[0]): CatchUpMark(*r) for r in rows}

    # -- the write path ------------------------------------------------------------------------

    def check_room(self, targets: Sequence[str]) -> None:
        """Before a local write: ResourceExhausted (503) when the object-storage tier's upload
        queue is at the cap. Unlike a peer's, it is never skipped (a write acknowledged without
        its upload queued could be evicted before any copy left this node)."""
        if OUTBOX_TARGET in targets and self.depth(OUTBOX_TARGET) >= self.max_depth_per_peer:
            raise ResourceExhausted(
                f"the object-store upload queue holds {self.depth(OUTBOX_TARGET)} messages "
                f"(KURA_OUTBOX_MAX_DEPTH={self.max_depth_per_peer}); the store is not keeping "
                "up or is down, retry later",
                retry_after_seconds=10,
            )

    def warnings(self) -> list[str]:
        """The object-storage tier's upload queue at its cap, for ``/ready`` warnings: every
        write is refused (503, ``check_room``) until the uploads drain, while reads go on."""
        depth = self.depth(OUTBOX_TARGET)
        if depth < self.max_depth_per_peer:
            return []
        return [
            f"the object-store upload queue is full ({depth} messages, "
            f"KURA_OUTBOX_MAX_DEPTH={self.max_depth_per_peer}): writes are refused with 503 "
            "until the store takes the uploads"
        ]

    def admit(self, conn: sqlite3.Connection, peers: Sequence[str], now_ms: int) -> list[str]:
        """Writer thread, before a local write's transaction: the ``peers`` whose queue has room
        for its one message (``admit_many``)."""
        return list(self.admit_many(conn, peers, now_ms, 1))

    def admit_many(
        self, conn: sqlite3.Connection, peers: Sequence[str], now_ms: int, count: int
    ) -> dict[str, int]:
        """Writer thread, before a transaction that enqueues ``count`` messages per peer (a
        group commit's batch): how many of them each of ``peers`` takes, the first ones, up to
        the room its queue has, so no queue ever holds more than its cap. A peer with no room
        is left out; what a peer does not take is skipped (counted) and, if it was not yet,
        the peer is marked ``overflow``."""
        taken: dict[str, int] = {}
        for peer in peers:
            # The object tier's queue is never skipped: check_room refused the write instead.
            room = self.max_depth_per_peer - self.depth(peer)
            n = count if peer == OUTBOX_TARGET else max(0, min(count, room))
            if n:
                taken[peer] = n
            if n == count:
                continue
            skipped = count - n
            self.skipped_total = {
                **self.skipped_total,
                peer: self.skipped_total.get(peer, 0) + skipped,
            }
            if peer not in self.marks:
                self._write_mark(
                    conn, CatchUpMark(peer, OVERFLOW, now_ms, now_ms - SINCE_MARGIN_MS, None, 0)
                )
        return taken

    def enqueued(self, peers: Iterable[str] | Mapping[str, int], per_peer: int = 1) -> None:
        """Writer thread, after a committed transaction enqueued ``per_peer`` rows per peer of
        ``peers``, or, for a mapping, as many as it maps each peer to."""
        counts = peers if isinstance(peers, Mapping) else dict.fromkeys(peers, per_peer)
        depths = dict(self.depths)
        for peer, n in counts.items():
            depths[peer] = depths.get(peer, 0) + n
            self._gauge().outbox_depth += n
        self.depths = depths

    def acked(self, conn: sqlite3.Connection, ids: Sequence[int]) -> int:
        """Writer thread: delete delivered messages in one transaction; returns how many. 0 when
        the disk is full (SQLITE_FULL): they stay and are delivered again (idempotent, LWW)."""
        gone: dict[str, int] = {}
        try:
            with write_transaction(conn):
                for i in ids:
                    row = conn.execute(
                        "DELETE FROM outbox WHERE id = ? RETURNING peer", (i,)
                    ).fetchone()
                    if row is not None:
                        gone[str(row[0])] = gone.get(str(row[0]), 0) + 1
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorname != "SQLITE_FULL":
                raise
            return 0
        depths = dict(self.depths)
        for peer, n in gone.items():
            depths[peer] = max(0, depths.get(peer, 0) - n)
        self.depths = depths
        removed = sum(gone.values())
        self._gauge().outbox_depth -= removed
        return removed

    # -- end of life and catch-up --------------------------------------------------------------

    def forget(self, conn: sqlite3.Connection, peer: str, now_ms: int) -> int:
        """Writer thread: drop ``peer``'s whole queue and mark it forgotten, in one transaction
        (reason: the one it was first marked for, else ``overflow`` for a queue at the cap,
        else ``absent``). Returns the messages dropped (0 if its queue was empty)."""
        with write_transaction(conn):
            n, lowest = conn.execute(
                "SELECT COUNT(*), MIN(version_ms) FROM outbox WHERE peer = ?", (peer,)
            ).fetchone()
            conn.execute("DELETE FROM outbox WHERE peer = ?", (peer,))
            old = self.marks.get(peer)
            since = min(
                now_ms,
                now_ms if lowest is None else int(lowest),
                now_ms if old is None else old.since_ms,
            )
            mark = CatchUpMark(
                peer,
                old.reason if old else OVERFLOW if n >= self.max_depth_per_peer else ABSENT,
                now_ms if old is None else old.marked_at_ms,
                since,
                now_ms,
                int(n) + (0 if old is None else old.dropped_messages),
            )
            self._write_mark(conn, mark)
        self.depths = {**self.depths, peer: 0}
        self._gauge().outbox_depth -= int(n)
        return int(n)

    def enqueue_tombstones(
        self,
        conn: sqlite3.Connection,
        peer: str,
        since_ms: int,
        now_ms: int,
        *,
        tombstones: bool = True,
    ) -> int:
        """Writer thread: enqueue for ``peer`` every namespace tombstone (unless not
        ``tombstones``) and every purge of a writer's entries (provenance) at or above
        ``since_ms`` (few: one per cleaned namespace or purged writer), in one transaction.
        Returns how many."""
        with write_transaction(conn):
            rows = conn.execute(
                "SELECT ?, '', namespace_id, version_ms FROM tombstones "
                "WHERE ? AND version_ms >= ? "
                "UNION ALL SELECT ?, writer, namespace_id, version_ms FROM purges "
                "WHERE version_ms >= ?",
                (DELETE_NAMESPACE, tombstones, since_ms, PURGE_WRITER, since_ms),
            ).fetchall()
            conn.executemany(
                "INSERT INTO outbox (peer, kind, artifact_id, namespace_id, version_ms, "
                "enqueued_at_ms) VALUES (?, ?, ?, ?, ?, ?)",
                [(peer, str(r[0]), str(r[1]), str(r[2]), int(r[3]), now_ms) for r in rows],
            )
        self.enqueued([peer], len(rows))
        return len(rows)

    def clear(self, conn: sqlite3.Connection, peer: str, skipped_at_start: int) -> bool:
        """Writer thread: remove ``peer``'s mark, unless messages were skipped for it since the
        catch-up pass began (``skipped_total`` was ``skipped_at_start``); then False (run the
        pass again: what was skipped may lie behind its cursor)."""
        if self.skipped_total.get(peer, 0) != skipped_at_start:
            return False
        conn.execute("DELETE FROM catch_up WHERE peer = ?", (peer,))
        self.marks = {p: m for p, m in self.marks.items() if p != peer}
        return True

    def _write_mark(self, conn: sqlite3.Connection, mark: CatchUpMark) -> None:
        """Autocommits outside a transaction; part of it inside one."""
        conn.execute(
            "INSERT OR REPLACE INTO catch_up (peer, reason, marked_at_ms, since_ms, "
            "forgotten_at_ms, dropped_messages) VALUES (?, ?, ?, ?, ?, ?)",
            (
                mark.peer,
                mark.reason,
                mark.marked_at_ms,
                mark.since_ms,
                mark.forgotten_at_ms,
                mark.dropped_messages,
            ),
        )
        self.marks = {**self.marks, mark.peer: mark}
