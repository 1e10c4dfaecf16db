"""Reading the change feed (serving side) and the durable per-peer cursors (pulling side).

Serving: ``read_page`` returns the tombstones and manifests whose change number
(``storage.change_seq``) is above ``since``, in change order, at most ``limit`` rows, read in
one transaction so the page, ``head_seq`` and ``epoch`` are one snapshot. A row that was
changed again carries only its newest number; a row evicted or deleted since is absent
(evictions are local; a tombstone's deletions travel as the tombstone).

Pulling: ``peer_cursors`` holds, per peer URL, the peer's epoch and the change number up to
which this node has applied that peer's feed. Written with one autocommitted statement on the
writer thread, after a page is fully applied (durable once the writer job returns:
``storage.group_commit``).
"""

from __future__ import annotations

import sqlite3

from kura.core.errors import Unavailable
from kura.storage import change_seq
from kura.storage.outbox import ChangesPage, PeerCursor
from kura.storage.schema import COLUMNS as _COLUMNS
from kura.storage.schema import row_to_manifest as _row_to_manifest


class FeedUnavailable(Exception):
    """The index has no change sequence (a pre-version-3 file opened read-only)."""


def read_page(conn: sqlite3.Connection, since: int, limit: int) -> ChangesPage:
    """Rows changed after ``since`` (>= 0), at most ``limit`` (>= 1). Any thread. Raises
    ``FeedUnavailable`` on an index without the sequence."""
    try:
        conn.execute("BEGIN")
        try:
            epoch, head_seq = change_seq.head(conn)
            tomb_rows = conn.execute(
                "SELECT seq, namespace_id, version_ms FROM tombstones WHERE seq > ? "
                "ORDER BY seq LIMIT ?",
                (since, limit + 1),
            ).fetchall()
            art_rows = conn.execute(
                f"SELECT seq, {_COLUMNS} FROM artifacts WHERE seq > ? ORDER BY seq LIMIT ?",
                (since, limit + 1),
            ).fetchall()
        finally:
            if conn.in_transaction:
                conn.execute("COMMIT")
    except sqlite3.OperationalError as exc:
        raise FeedUnavailable(f"change feed unavailable: {exc}") from exc
    merged = sorted(
        [(int(r[0]), 0, r) for r in tomb_rows] + [(int(r[0]), 1, r) for r in art_rows],
        key=lambda e: e[0],
    )
    page, more = merged[:limit], len(merged) > limit
    return ChangesPage(
        epoch=epoch,
        head_seq=head_seq,
        tombstones=[(str(r[1]), int(r[2])) for _s, kind, r in page if kind == 0],
        manifests=[_row_to_manifest(r[1:]) for _s, kind, r in page if kind == 1],
        next_since=page[-1][0] if more else head_seq,
        more=more,
    )


def load_cursor(conn: sqlite3.Connection, peer: str) -> PeerCursor | None:
    """The cursor, or None (none stored, or an index without the table: read-only, older)."""
    try:
        row = conn.execute("SELECT epoch, seq FROM peer_cursors WHERE peer = ?", (peer,)).fetchone()
    except sqlite3.OperationalError:
        return None
    return None if row is None else PeerCursor(peer, str(row[0]), int(row[1]))


def store_cursor(
    conn: sqlite3.Connection, peer: str, epoch: str, seq: int, now_ms: int
) -> PeerCursor:
    """Writer thread: record that ``peer``'s feed of ``epoch`` is applied up to ``seq``.
    Raises ``Unavailable`` when it cannot be written (a read-only index, a full disk): the
    pass then fails and is retried, from the cursor stored before."""
    try:
        conn.execute(
            "INSERT OR REPLACE INTO peer_cursors(peer, epoch, seq, updated_at_ms) VALUES (?,?,?,?)",
            (peer, epoch, seq, now_ms),
        )
    except sqlite3.OperationalError as exc:
        raise Unavailable(f"cannot record the cursor of {peer}: {exc}") from exc
    return PeerCursor(peer, epoch, seq)


def head(conn: sqlite3.Connection) -> tuple[str, int]:
    """(epoch, head seq) of this node's own feed."""
    return change_seq.head(conn)
