"""Range digests of the artifact keyspace, kept incrementally for anti-entropy (issue 11,
deliverable 3; ``mesh.anti_entropy`` compares them between peers).

The keyspace is ``artifact_id`` (hex SHA-256, so uniform). A *range* is a hex prefix of length
0 (everything), 2 (256 ranges) or 4 (65,536 ranges). Each range's digest is ``(rows, hash)``:
how many artifacts it holds and the XOR of a 64-bit per-row hash of
``(artifact_id, version_ms, sha256)`` (BLAKE2b, RFC 7693, truncated to 8 bytes). XOR makes the
digest order-free and updatable in O(1): adding and removing a row are the same operation.

Table ``ae_ranges(level, prefix, rows, hash)`` holds the three levels (at most 65,793 rows),
keyed by ``(level, prefix)`` so that the children of a range are one index range scan: a
request costs O(ranges returned), never O(table). It is
updated in the *same transaction* as every change of ``artifacts`` (``MetadataIndex.upsert``,
``delete`` (eviction, quarantine, start-up reconcile) and ``apply_tombstone``), three small
upserts per changed row, so a digest can never disagree with the data it summarises. It is
not part of the schema version: ``ensure`` creates it (``CREATE TABLE IF NOT EXISTS``) and
back-fills it at open when the meta flag is missing, or when its row count disagrees with the
table (an index written meanwhile by a kura without this module). The back-fill reads every
row once: measured 1.1 s for 200,000 artifacts on the shared 2-core test machine (about 5 s per
million); the check at every open (a ``COUNT(*)``) took 2 ms there.

SQLite has no XOR operator; ``a ^ b`` is written ``(a | b) & ~(a & b)``
(https://www.sqlite.org/lang_expr.html#operators). Hashes are signed 64-bit integers, as
SQLite stores them; on the wire they are 16 lowercase hex digits (``hex64``).

Tombstones are few (one per cleaned namespace): their digest is computed on the fly
(``tombstones_digest``), O(tombstones).

Every function takes the caller's connection; writes run on the writer thread inside the
caller's transaction (``apply``) or in their own (``ensure``).
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Iterable

from kura.core.errors import Unavailable
from kura.storage.outbox import DIGEST_DEEPEST, DIGEST_LEVELS
from kura.storage.schema import write_transaction

LEVELS = DIGEST_LEVELS
DEEPEST = DIGEST_DEEPEST
BUILT_FLAG = "ae_ranges_built"

SCHEMA = """
CREATE TABLE IF NOT EXISTS ae_ranges (
    level  INTEGER NOT NULL,
    prefix TEXT NOT NULL,
    rows   INTEGER NOT NULL,
    hash   INTEGER NOT NULL,
    PRIMARY KEY (level, prefix)
) WITHOUT ROWID;
"""

_XOR_UPSERT = (
    "INSERT INTO ae_ranges(level, prefix, rows, hash) VALUES (?, ?, ?, ?) "
    "ON CONFLICT(level, prefix) DO UPDATE SET rows = rows + excluded.rows, "
    "hash = (hash | excluded.hash) & ~(hash & excluded.hash)"
)

Row = tuple[str, int, str]  # (artifact_id, version_ms, sha256)


def row_hash(artifact_id: str, version_ms: int, sha256: str) -> int:
    """The 64-bit hash of one row, as a signed integer (SQLite's INTEGER)."""
    digest = hashlib.blake2b(
        f"{artifact_id}:{version_ms}:{sha256}".encode(), digest_size=8
    ).digest()
    return int.from_bytes(digest, "big", signed=True)


def hex64(value: int) -> str:
    """A signed 64-bit hash as 16 lowercase hex digits (two's complement)."""
    return f"{value & 0xFFFF_FFFF_FFFF_FFFF:016x}"


def apply(conn: sqlite3.Connection, removed: Iterable[Row], added: Iterable[Row]) -> None:
    """Fold rows leaving and entering ``artifacts`` into the digests. Must run inside the
    transaction that changes ``artifacts``; a replaced row is one removed and one added."""
    deltas: dict[str, list[int]] = {}
    for sign, rows in ((-1, removed), (1, added)):
        for aid, version_ms, sha256 in rows:
            h = row_hash(aid, version_ms, sha256)
            for level in LEVELS:
                d = deltas.setdefault(aid[:level], [0, 0])
                d[0] += sign
                d[1] ^= h
    conn.executemany(_XOR_UPSERT, ((len(p), p, n, h) for p, (n, h) in deltas.items()))


def rows_of(conn: sqlite3.Connection, artifact_ids: Iterable[str]) -> list[Row]:
    """The (artifact_id, version_ms, sha256) rows held for ``artifact_ids`` (absent ones are
    left out), for ``apply`` before they are deleted."""
    out: list[Row] = []
    for aid in artifact_ids:
        row = conn.execute(
            "SELECT version_ms, sha256 FROM artifacts WHERE artifact_id = ?", (aid,)
        ).fetchone()
        if row is not None:
            out.append((aid, int(row[0]), str(row[1])))
    return out


def ensure(conn: sqlite3.Connection, *, back_fill: bool = True) -> bool:
    """Create the table and back-fill it if it is not known to be complete (writer thread,
    at open; with ``back_fill`` False only the table is created, and the O(rows) check and
    back-fill are left to a later call, ``MetadataIndex.ensure_digests``). Returns True when
    it was (re)built."""
    conn.executescript(SCHEMA)
    if not back_fill:
        return False
    built = conn.execute("SELECT v FROM meta WHERE k = ?", (BUILT_FLAG,)).fetchone()
    if built is not None:
        root = conn.execute("SELECT rows FROM ae_ranges WHERE level = 0").fetchone()
        count = int(conn.execute("SELECT COUNT(*) FROM artifacts").fetchone()[0])
        if (0 if root is None else int(root[0])) == count:
            return False
    with write_transaction(conn):
        conn.execute("DELETE FROM ae_ranges")
        totals: dict[str, list[int]] = {}
        for aid, version_ms, sha256 in conn.execute(
            "SELECT artifact_id, version_ms, sha256 FROM artifacts"
        ):
            h = row_hash(str(aid), int(version_ms), str(sha256))
            for level in LEVELS:
                d = totals.setdefault(str(aid)[:level], [0, 0])
                d[0] += 1
                d[1] ^= h
        conn.executemany(
            "INSERT INTO ae_ranges(level, prefix, rows, hash) VALUES (?, ?, ?, ?)",
            ((len(p), p, n, h) for p, (n, h) in totals.items()),
        )
        conn.execute("INSERT OR REPLACE INTO meta(k, v) VALUES (?, '1')", (BUILT_FLAG,))
    return True


def ranges(conn: sqlite3.Connection, prefix: str, depth: int) -> list[tuple[str, int, int]]:
    """(prefix, rows, hash) of the non-empty ranges ``depth`` hex digits below ``prefix``
    (``depth`` 0: the range itself), in prefix order. A range left out is empty (0, 0).
    ``len(prefix) + depth`` must be one of ``LEVELS`` (ValueError otherwise)."""
    level = len(prefix) + depth
    if level not in LEVELS or depth < 0:
        raise ValueError(f"prefix length + depth must be one of {LEVELS}")
    # Hex digits sort below "g", so [prefix, prefix + "g") is every key starting with prefix.
    try:
        rows = conn.execute(
            "SELECT prefix, rows, hash FROM ae_ranges WHERE level = ? AND prefix >= ? "
            "AND prefix < ? AND rows > 0 ORDER BY prefix",
            (level, prefix, prefix + "g"),
        ).fetchall()
    except sqlite3.OperationalError as exc:  # a read-only index from a kura without digests
        raise Unavailable(f"range digests are not available on this node: {exc}") from exc
    return [(str(p), int(n), int(h)) for p, n, h in rows]


def tombstones_digest(conn: sqlite3.Connection) -> tuple[int, int]:
    """(count, XOR of the hash of each (namespace_id, version_ms)) over every tombstone."""
    count = acc = 0
    for namespace_id, version_ms in conn.execute("SELECT namespace_id, version_ms FROM tombstones"):
        count += 1
        acc ^= row_hash(str(namespace_id), int(version_ms), "tombstone")
    return count, acc
