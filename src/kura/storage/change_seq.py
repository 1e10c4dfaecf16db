"""The node's change sequence and epoch (issue 11, deliverable 2: incremental catch-up).

Every row change this node makes to ``artifacts`` (a local write or an applied replica) and to
``tombstones`` (a tombstone applied) takes the next value of one per-node counter, stored as
``meta['change_seq']`` and written into the row's ``seq`` column *in the same transaction* as the
change (``next_seq``), so a committed change always carries its number and a number is never
reused (the counter only grows, even when the row with the highest number is evicted or deleted
by a tombstone). A reader that saw ``seq = s`` committed also sees every change numbered below
``s``: one writer thread numbers and commits the changes in order, and a WAL read transaction
sees one committed snapshot (https://www.sqlite.org/isolation.html).

``meta['epoch']`` is a random id chosen when the index is created (or migrated to version 3).
A damaged index that is set aside and rebuilt is a new file, hence a new epoch: a peer's cursor
into another epoch's numbering is meaningless, and the peer falls back to a full bootstrap.

Schema version 3 adds both ``seq`` columns (``ALTER TABLE ... ADD COLUMN``) and numbers the
existing rows in one transaction: tombstones first, then artifacts, each in (version_ms, key)
order, so a peer pulling the whole feed meets a tombstone before the manifests written after it.

Writer thread only (the caller passes that thread's connection), except ``head``.
"""

from __future__ import annotations

import secrets
import sqlite3

SEQ_KEY = "change_seq"
EPOCH_KEY = "epoch"

# Run after the tables exist with their ``seq`` column (created, or migrated to version 3).
SCHEMA = """
CREATE INDEX IF NOT EXISTS artifacts_by_seq ON artifacts(seq);
CREATE INDEX IF NOT EXISTS tombstones_by_seq ON tombstones(seq);
CREATE TABLE IF NOT EXISTS peer_cursors (
    peer          TEXT PRIMARY KEY,
    epoch         TEXT NOT NULL,
    seq           INTEGER NOT NULL,
    updated_at_ms INTEGER NOT NULL
);
"""


def new_epoch() -> str:
    """A random 128-bit id, hex."""
    return secrets.token_hex(16)


def initialise(conn: sqlite3.Connection) -> None:
    """A new index: counter at 0 and a fresh epoch (inside the caller's transaction or not)."""
    conn.execute("INSERT OR REPLACE INTO meta(k, v) VALUES (?, '0')", (SEQ_KEY,))
    conn.execute("INSERT OR REPLACE INTO meta(k, v) VALUES (?, ?)", (EPOCH_KEY, new_epoch()))


def next_seq(conn: sqlite3.Connection) -> int:
    """Take the next change number. Call inside the transaction that makes the change, so the
    number and the change commit (or roll back) together."""
    return take_seqs(conn, 1)


def take_seqs(conn: sqlite3.Connection, count: int) -> int:
    """Take the next ``count`` (>= 1) change numbers at once, for as many changes made in order
    in one transaction (a batch write): the first of them; the others follow it, consecutive."""
    row = conn.execute(
        "UPDATE meta SET v = CAST(v AS INTEGER) + ? WHERE k = ? RETURNING v", (count, SEQ_KEY)
    ).fetchone()
    if row is None:
        raise RuntimeError("index has no change counter (schema older than version 3)")
    return int(row[0]) - count + 1


def head(conn: sqlite3.Connection) -> tuple[str, int]:
    """(epoch, the last change number taken; 0 before any change)."""
    rows = dict(
        conn.execute("SELECT k, v FROM meta WHERE k IN (?, ?)", (SEQ_KEY, EPOCH_KEY)).fetchall()
    )
    return str(rows.get(EPOCH_KEY, "")), int(rows.get(SEQ_KEY, 0))


def migrate(conn: sqlite3.Connection) -> None:
    """To version 3, inside the caller's transaction: add the ``seq`` columns, number every
    existing row (module docstring) and start the counter after them, with a new epoch."""
    for table in ("artifacts", "tombstones"):
        columns = {str(r[1]) for r in conn.execute(f"PRAGMA table_info({table})")}
        if "seq" not in columns:
            conn.execute(f"ALTER TABLE {table} ADD COLUMN seq INTEGER")
    conn.execute("CREATE TEMP TABLE seq_numbering (id TEXT PRIMARY KEY, n INTEGER NOT NULL)")
    try:
        taken = 0
        for table, key in (("tombstones", "namespace_id"), ("artifacts", "artifact_id")):
            conn.execute("DELETE FROM seq_numbering")
            conn.execute(
                f"INSERT INTO seq_numbering(id, n) SELECT {key}, "
                f"? + ROW_NUMBER() OVER (ORDER BY version_ms, {key}) FROM {table}",
                (taken,),
            )
            conn.execute(
                f"UPDATE {table} SET seq = seq_numbering.n FROM seq_numbering "
                f"WHERE seq_numbering.id = {table}.{key}"
            )
            taken += int(conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])
    finally:
        conn.execute("DROP TABLE temp.seq_numbering")
    conn.execute("INSERT OR REPLACE INTO meta(k, v) VALUES (?, ?)", (SEQ_KEY, str(taken)))
    conn.execute("INSERT OR REPLACE INTO meta(k, v) VALUES (?, ?)", (EPOCH_KEY, new_epoch()))
