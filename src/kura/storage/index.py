"""The metadata index in SQLite (WAL): manifests, inline bodies, tombstones, access times, and
the replication outbox.

Replication intent is durable: ``upsert`` and ``apply_tombstone`` write one outbox row per target
peer in the *same* transaction as the data change (Kura's rule, kura-behaviour.md §3), so a
crash can never leave a stored artifact that no peer will hear about. Every change of
``artifacts`` (upsert, delete, tombstone) also folds into the anti-entropy range digests
(``storage.digests``) in that same transaction.

All methods are synchronous and blocking; ``CacheService`` calls them from its executors. One
connection per thread (SQLite connections must not be shared across threads without care); all
writes go through a single writer thread, so write transactions never contend.

The schema carries a version in ``meta``; opening the index creates or migrates it in place.
Version 2 added ``artifacts.xxh3_128`` (the fast checksum of ``storage.checksum``, NULL for rows
written before it): an ``ALTER TABLE ... ADD COLUMN``, which rewrites no row
(https://www.sqlite.org/lang_altertable.html#altertabaddcol). A version-1 file opened read-only
(a full disk) is read as it is, every row without a checksum. Version 3 added the change
sequence (``artifacts.seq``, ``tombstones.seq``, ``meta['change_seq']``, ``meta['epoch']``) and
the ``peer_cursors`` table: ``storage.change_seq`` owns them and their migration.

Durability: every connection runs ``synchronous=FULL``, so in WAL mode each COMMIT fsyncs the
WAL before it returns; a committed row survives a power loss, not only a process crash
(https://www.sqlite.org/pragma.html#pragma_synchronous; ``NORMAL`` may lose the last commits on
power loss). ``docs/durability.md`` states the whole guarantee.

``read_only=True`` opens the file with ``immutable=1`` (no ``-shm``, no locks, no writes): the
start-up fallback on a full disk, where SQLite cannot size the ``-shm`` file it needs for WAL
(``SQLITE_IOERR_SHMSIZE``). Only valid while nothing else writes the file and its WAL is empty
(https://www.sqlite.org/uri.html#uriimmutable).
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from kura.core.manifest import Manifest
from kura.core.object_layout import OUTBOX_TARGET
from kura.storage import change_seq, digests

SCHEMA_VERSION = 3
# Versions a read-only open accepts as they are (it cannot migrate).
READABLE_SCHEMA_VERSIONS = (1, 2, 3)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS artifacts (
    artifact_id    TEXT PRIMARY KEY,
    producer       TEXT NOT NULL,
    namespace_id   TEXT NOT NULL,
    key            TEXT NOT NULL,
    content_type   TEXT NOT NULL,
    size           INTEGER NOT NULL,
    sha256         TEXT NOT NULL,
    version_ms     INTEGER NOT NULL,
    created_at_ms  INTEGER NOT NULL,
    last_access_ms INTEGER NOT NULL,
    inline_body    BLOB,
    headers        TEXT NOT NULL DEFAULT '{}',
    stat_sig       TEXT,
    xxh3_128       TEXT,
    seq            INTEGER
);
CREATE INDEX IF NOT EXISTS artifacts_by_namespace ON artifacts(namespace_id);
-- Eviction order, ties (a bootstrap stamps its copies alike) by oldest version: the whole order
-- in the index, so a batch reads O(batch) rows however large a tie is. It replaces the
-- last_access_ms-only index; the DROP is a no-op after the first open.
DROP INDEX IF EXISTS artifacts_by_access;
CREATE INDEX IF NOT EXISTS artifacts_by_access_version
    ON artifacts(last_access_ms, version_ms, artifact_id);
-- Bootstrap pages newest first (mesh.bootstrap_budget). Indexes, not a schema change: a file of
-- any schema version gets them at its next writable open (built once, O(rows)).
CREATE INDEX IF NOT EXISTS artifacts_by_version ON artifacts(version_ms DESC, artifact_id);
CREATE TABLE IF NOT EXISTS tombstones (
    namespace_id TEXT PRIMARY KEY,
    version_ms   INTEGER NOT NULL,
    seq          INTEGER
);
CREATE TABLE IF NOT EXISTS outbox (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    peer           TEXT NOT NULL,
    kind           TEXT NOT NULL,
    artifact_id    TEXT NOT NULL DEFAULT '',
    namespace_id   TEXT NOT NULL DEFAULT '',
    version_ms     INTEGER NOT NULL,
    enqueued_at_ms INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS outbox_by_peer ON outbox(peer, id);
CREATE INDEX IF NOT EXISTS outbox_by_artifact ON outbox(artifact_id);
"""

UPSERT = "upsert_artifact"
DELETE_NAMESPACE = "delete_namespace"


@dataclass(frozen=True)
class OutboxMessage:
    """One pending delivery to one peer. ``kind`` is UPSERT or DELETE_NAMESPACE."""

    id: int
    peer: str
    kind: str
    artifact_id: str
    namespace_id: str
    version_ms: int
    enqueued_at_ms: int


_COLUMNS = (
    "artifact_id, producer, namespace_id, key, content_type, size, sha256, version_ms, "
    "created_at_ms, inline_body IS NOT NULL, headers"
)


def _row_to_manifest(row: tuple[object, ...]) -> Manifest:
    return Manifest(
        artifact_id=str(row[0]),
        producer=str(row[1]),
        namespace_id=str(row[2]),
        key=str(row[3]),
        content_type=str(row[4]),
        size=int(row[5]),  # type: ignore[call-overload]
        sha256=str(row[6]),
        version_ms=int(row[7]),  # type: ignore[call-overload]
        created_at_ms=int(row[8]),  # type: ignore[call-overload]
        inline=bool(row[9]),
        headers=json.loads(str(row[10])),
    )


def _cursor(column: str, after: str | None) -> tuple[str, tuple[str, ...]]:
    """The WHERE clause of a cursor page. None starts at the first row: ``""`` cannot mean
    "from the start" because it is a real key (the tenant-wide namespace), which a ``> ''``
    first page skipped."""
    return ("1", ()) if after is None else (f"{column} > ?", (after,))


class MetadataIndex:
    """SQLite access. Thread-safe: each thread gets its own connection."""

    def __init__(self, path: Path, *, read_only: bool = False) -> None:
        self._path = path
        self.read_only = read_only
        self._local = threading.local()
        # The expression ``get`` selects for the fast checksum (NULL on a version-1 file).
        self._xxh3_column = "xxh3_128"
        conn = self._conn()
        if read_only:
            row = conn.execute("SELECT v FROM meta WHERE k = 'schema_version'").fetchone()
            if row is None or int(row[0]) not in READABLE_SCHEMA_VERSIONS:
                raise RuntimeError(f"metadata schema {row} cannot be opened read-only")
            if int(row[0]) < 2:
                self._xxh3_column = "NULL"
            return
        conn.executescript(_SCHEMA)
        row = conn.execute("SELECT v FROM meta WHERE k = 'schema_version'").fetchone()
        if row is None:
            conn.execute(
                "INSERT INTO meta(k, v) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
            )
            change_seq.initialise(conn)
        elif int(row[0]) > SCHEMA_VERSION:
            raise RuntimeError(
                f"metadata schema version {row[0]} is newer than this kura ({SCHEMA_VERSION})"
            )
        elif int(row[0]) < SCHEMA_VERSION:
            _migrate_schema(conn)
        conn.executescript(change_seq.SCHEMA)
        conn.commit()
        digests.ensure(conn)  # anti-entropy range digests, outside the schema version

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None and self.read_only:
            uri = f"file:{self._path}?immutable=1"
            conn = sqlite3.connect(uri, isolation_level=None, check_same_thread=True, uri=True)
            self._local.conn = conn
        elif conn is None:
            conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=True)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute("PRAGMA busy_timeout=5000")
            self._local.conn = conn
        return conn

    def connection(self) -> sqlite3.Connection:
        """This thread's connection, for storage modules owning tables of their own
        (``storage.peer_queue``). Same rules: writes on the writer thread only."""
        return self._conn()

    def close_thread_connection(self) -> None:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    # -- reads -------------------------------------------------------------------------------

    def quick_check(self) -> str:
        """``PRAGMA quick_check``: "ok", or the first problem SQLite found (a damaged page,
        an index out of step with its table). Reads every page: O(file size)."""
        rows = self._conn().execute("PRAGMA quick_check(1)").fetchall()
        return str(rows[0][0]) if rows else "ok"

    def get(self, artifact_id: str) -> tuple[Manifest, bytes | None, str | None, str | None] | None:
        """(manifest, inline body or None, stat signature or None, XXH3-128 hex or None), or
        None if absent."""
        row = (
            self._conn()
            .execute(
                f"SELECT {_COLUMNS}, inline_body, stat_sig, {self._xxh3_column} "
                "FROM artifacts WHERE artifact_id = ?",
                (artifact_id,),
            )
            .fetchone()
        )
        if row is None:
            return None
        return _row_to_manifest(row), row[11], row[12], row[13]

    def exists(self, artifact_id: str) -> bool:
        row = (
            self._conn()
            .execute("SELECT 1 FROM artifacts WHERE artifact_id = ?", (artifact_id,))
            .fetchone()
        )
        return row is not None

    def existing(self, artifact_ids: Sequence[str]) -> set[str]:
        """The ids of ``artifact_ids`` that have a row (queried in chunks of 500)."""
        found: set[str] = set()
        conn = self._conn()
        for start in range(0, len(artifact_ids), 500):
            chunk = artifact_ids[start : start + 500]
            marks = ",".join("?" * len(chunk))
            found.update(
                str(r[0])
                for r in conn.execute(
                    f"SELECT artifact_id FROM artifacts WHERE artifact_id IN ({marks})", chunk
                )
            )
        return found

    def versions(self, artifact_ids: Sequence[str]) -> dict[str, tuple[int, str]]:
        """``artifact_id -> (version_ms, sha256)`` for the ids of ``artifact_ids`` that have a
        row (queried in chunks of 500): the batch form of what the version rule reads."""
        found: dict[str, tuple[int, str]] = {}
        conn = self._conn()
        for start in range(0, len(artifact_ids), 500):
            chunk = artifact_ids[start : start + 500]
            marks = ",".join("?" * len(chunk))
            for r in conn.execute(
                "SELECT artifact_id, version_ms, sha256 FROM artifacts "
                f"WHERE artifact_id IN ({marks})",
                chunk,
            ):
                found[str(r[0])] = (int(r[1]), str(r[2]))
        return found

    def tombstone(self, namespace_id: str) -> int | None:
        row = (
            self._conn()
            .execute("SELECT version_ms FROM tombstones WHERE namespace_id = ?", (namespace_id,))
            .fetchone()
        )
        return None if row is None else int(row[0])

    def max_version_ms(self, namespace_id: str | None = None) -> int:
        """The largest version stored for ``namespace_id``'s artifacts, or with None for any
        artifact or tombstone (where the version clock starts after a restart); 0 when none."""
        conn = self._conn()
        if namespace_id is not None:
            row = conn.execute(
                "SELECT COALESCE(MAX(version_ms), 0) FROM artifacts WHERE namespace_id = ?",
                (namespace_id,),
            ).fetchone()
            return int(row[0])
        row = conn.execute(
            "SELECT MAX(COALESCE((SELECT MAX(version_ms) FROM artifacts), 0), "
            "COALESCE((SELECT MAX(version_ms) FROM tombstones), 0))"
        ).fetchone()
        return int(row[0])

    def totals(self) -> tuple[int, int]:
        """(artifact count, bytes of file-backed and inline bodies)."""
        row = (
            self._conn()
            .execute("SELECT COUNT(*), COALESCE(SUM(size), 0) FROM artifacts")
            .fetchone()
        )
        return int(row[0]), int(row[1])

    def manifests_after(self, after: str | None, limit: int) -> list[Manifest]:
        """Manifests with artifact_id > ``after`` (every one when ``after`` is None), in
        artifact_id order, at most ``limit``."""
        where, args = _cursor("artifact_id", after)
        rows = (
            self._conn()
            .execute(
                f"SELECT {_COLUMNS} FROM artifacts WHERE {where} ORDER BY artifact_id LIMIT ?",
                (*args, limit),
            )
            .fetchall()
        )
        return [_row_to_manifest(r) for r in rows]

    def manifests_newest(self, after: tuple[int, str] | None, limit: int) -> list[Manifest]:
        """At most ``limit`` manifests ordered by (version_ms descending, artifact_id), strictly
        after the cursor ``after = (version_ms, artifact_id)`` (None: from the newest).

        Two range seeks on ``artifacts_by_version`` (the rest of the cursor's version, then the
        older versions), so a page costs O(limit) however deep it is."""
        conn = self._conn()
        rows: list[tuple[object, ...]] = []
        args: tuple[int, ...] = ()
        if after is None:
            where = "1"
        else:
            version_ms, artifact_id = after
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM artifacts WHERE version_ms = ? AND artifact_id > ? "
                "ORDER BY version_ms DESC, artifact_id LIMIT ?",
                (version_ms, artifact_id, limit),
            ).fetchall()
            where, args = "version_ms < ?", (version_ms,)
        if len(rows) < limit:
            rows += conn.execute(
                f"SELECT {_COLUMNS} FROM artifacts WHERE {where} "
                "ORDER BY version_ms DESC, artifact_id LIMIT ?",
                (*args, limit - len(rows)),
            ).fetchall()
        return [_row_to_manifest(r) for r in rows]

    def all_ids(self) -> set[str]:
        return {r[0] for r in self._conn().execute("SELECT artifact_id FROM artifacts")}

    def tombstones_after(self, after: str | None, limit: int) -> list[tuple[str, int]]:
        """(namespace_id, version_ms) with namespace_id > ``after`` (every one when ``after`` is
        None, so the tenant-wide namespace ``""`` is on the first page), in namespace_id order,
        at most ``limit``."""
        where, args = _cursor("namespace_id", after)
        rows = (
            self._conn()
            .execute(
                f"SELECT namespace_id, version_ms FROM tombstones WHERE {where} "
                "ORDER BY namespace_id LIMIT ?",
                (*args, limit),
            )
            .fetchall()
        )
        return [(str(r[0]), int(r[1])) for r in rows]

    def least_recently_used(
        self, limit: int, exclude: str, used_before_ms: int | None = None
    ) -> list[tuple[str, int, bool]]:
        """Up to ``limit`` (artifact_id, size, inline) oldest by access (equal stamps: oldest
        version first), skipping ``exclude`` and, with ``used_before_ms``, every artifact last
        used (or written) at or after it. An artifact whose upload to the object-storage tier
        is pending is never picked (its only copy is here)."""
        before = (1 << 62) if used_before_ms is None else used_before_ms
        rows = (
            self._conn()
            .execute(
                "SELECT artifact_id, size, inline_body IS NOT NULL FROM artifacts a "
                "WHERE artifact_id != ? AND last_access_ms < ? "
                "AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.artifact_id = a.artifact_id "
                "AND o.peer = ?) "  # object tier
                "ORDER BY last_access_ms, version_ms, artifact_id LIMIT ?",
                (exclude, before, OUTBOX_TARGET, limit),
            )
            .fetchall()
        )
        return [(str(r[0]), int(r[1]), bool(r[2])) for r in rows]

    # -- writes (writer thread only) ---------------------------------------------------------

    def upsert(
        self,
        manifest: Manifest,
        inline_body: bytes | None,
        stat_sig: str | None,
        now_ms: int,
        outbox_peers: Sequence[str] = (),
        *,
        xxh3_128: str | None = None,
    ) -> int | None:
        """Insert or replace one manifest (with the XXH3-128 of its file's bytes, if known)
        and enqueue it for ``outbox_peers``, atomically; return the size it replaced (None if
        new)."""
        return self.upsert_many(
            [(manifest, inline_body, stat_sig, xxh3_128)], now_ms, outbox_peers
        )[0]

    def upsert_many(
        self,
        rows: Sequence[tuple[Manifest, bytes | None, str | None, str | None]],
        now_ms: int,
        outbox_peers: Sequence[str] = (),
    ) -> list[int | None]:
        """``upsert`` for many ``(manifest, inline body, stat signature, XXH3-128)`` rows in one
        transaction (one durable commit); return the sizes they replaced, in order."""
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        replaced: list[int | None] = []
        try:
            for manifest, inline_body, stat_sig, xxh3_128 in rows:
                old = conn.execute(
                    "SELECT size, version_ms, sha256 FROM artifacts WHERE artifact_id = ?",
                    (manifest.artifact_id,),
                ).fetchone()
                replaced.append(None if old is None else int(old[0]))
                conn.execute(
                    "INSERT OR REPLACE INTO artifacts (artifact_id, producer, namespace_id, key, "
                    "content_type, size, sha256, version_ms, created_at_ms, last_access_ms, "
                    "inline_body, headers, stat_sig, xxh3_128, seq) "
                    "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    (
                        manifest.artifact_id,
                        manifest.producer,
                        manifest.namespace_id,
                        manifest.key,
                        manifest.content_type,
                        manifest.size,
                        manifest.sha256,
                        manifest.version_ms,
                        manifest.created_at_ms,
                        now_ms,
                        inline_body,
                        json.dumps(manifest.headers, sort_keys=True),
                        stat_sig,
                        xxh3_128,
                        change_seq.next_seq(conn),
                    ),
                )
                digests.apply(
                    conn,
                    [] if old is None else [(manifest.artifact_id, int(old[1]), str(old[2]))],
                    [(manifest.artifact_id, manifest.version_ms, manifest.sha256)],
                )
                conn.executemany(
                    "INSERT INTO outbox (peer, kind, artifact_id, version_ms, enqueued_at_ms) "
                    "VALUES (?, ?, ?, ?, ?)",
                    (
                        (p, UPSERT, manifest.artifact_id, manifest.version_ms, now_ms)
                        for p in outbox_peers
                    ),
                )
            conn.execute("COMMIT")
        except BaseException:
            _rollback(conn)
            raise
        return replaced

    def delete(self, artifact_ids: Iterable[str]) -> None:
        conn = self._conn()
        artifact_ids = list(artifact_ids)
        conn.execute("BEGIN IMMEDIATE")
        try:
            digests.apply(conn, digests.rows_of(conn, artifact_ids), ())
            conn.executemany(
                "DELETE FROM artifacts WHERE artifact_id = ?", ((a,) for a in artifact_ids)
            )
            conn.execute("COMMIT")
        except BaseException:
            _rollback(conn)
            raise

    def apply_tombstone(
        self, namespace_id: str, version_ms: int, now_ms: int, outbox_peers: Sequence[str] = ()
    ) -> list[tuple[str, int, bool]] | None:
        """Raise the namespace tombstone to ``version_ms``, delete the namespace's artifacts at or
        below it and enqueue the delete for ``outbox_peers``, in one transaction.

        Returns the deleted (artifact_id, size, inline) rows, or None when a tombstone at or
        above ``version_ms`` already existed (nothing changes, nothing is enqueued).
        """
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            row = conn.execute(
                "SELECT version_ms FROM tombstones WHERE namespace_id = ?", (namespace_id,)
            ).fetchone()
            if row is not None and int(row[0]) >= version_ms:
                conn.execute("COMMIT")
                return None
            conn.execute(
                "INSERT OR REPLACE INTO tombstones(namespace_id, version_ms, seq) VALUES (?, ?, ?)",
                (namespace_id, version_ms, change_seq.next_seq(conn)),
            )
            victims = [
                (str(r[0]), int(r[1]), bool(r[2]))
                for r in conn.execute(
                    "SELECT artifact_id, size, inline_body IS NOT NULL FROM artifacts "
                    "WHERE namespace_id = ? AND version_ms <= ?",
                    (namespace_id, version_ms),
                )
            ]
            digests.apply(conn, digests.rows_of(conn, [v[0] for v in victims]), ())
            conn.executemany(
                "DELETE FROM artifacts WHERE artifact_id = ?", ((v[0],) for v in victims)
            )
            conn.executemany(
                "INSERT INTO outbox (peer, kind, namespace_id, version_ms, enqueued_at_ms) "
                "VALUES (?, ?, ?, ?, ?)",
                ((p, DELETE_NAMESPACE, namespace_id, version_ms, now_ms) for p in outbox_peers),
            )
            conn.execute("COMMIT")
            return victims
        except BaseException:
            _rollback(conn)
            raise

    # -- outbox --------------------------------------------------------------------------------

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

    def touch(self, accesses: dict[str, int]) -> None:
        """Record last access times (batched from memory)."""
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.executemany(
                "UPDATE artifacts SET last_access_ms = MAX(last_access_ms, ?) WHERE artifact_id = ?",
                ((ms, a) for a, ms in accesses.items()),
            )
            conn.execute("COMMIT")
        except BaseException:
            _rollback(conn)
            raise

    def set_stat_sig(self, artifact_id: str, stat_sig: str) -> None:
        """Record a verified file's stat signature. Best effort: it only saves a re-hash, so a
        failed write (a full disk) is ignored and the next read hashes again."""
        if self.read_only:
            return
        with contextlib.suppress(sqlite3.OperationalError):
            self._conn().execute(
                "UPDATE artifacts SET stat_sig = ? WHERE artifact_id = ?", (stat_sig, artifact_id)
            )

    def set_xxh3_128(self, manifest: Manifest, xxh3_128: str) -> None:
        """Record the XXH3-128 of bytes that were just verified to hash to ``manifest.sha256``
        (a row written before schema 2). Only the row of exactly that version without a
        checksum changes, so a newer version written meanwhile is never given another
        version's checksum. Best effort, like ``set_stat_sig``."""
        if self.read_only:
            return
        with contextlib.suppress(sqlite3.OperationalError):
            self._conn().execute(
                "UPDATE artifacts SET xxh3_128 = ? WHERE artifact_id = ? AND version_ms = ? "
                "AND sha256 = ? AND size = ? AND xxh3_128 IS NULL",
                (
                    xxh3_128,
                    manifest.artifact_id,
                    manifest.version_ms,
                    manifest.sha256,
                    manifest.size,
                ),
            )


def _migrate_schema(conn: sqlite3.Connection) -> None:
    """Version 1 or 2 to 3 in one transaction: add ``artifacts.xxh3_128`` (NULL for every row)
    if missing, then the change sequence (``change_seq.migrate``)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        columns = {str(r[1]) for r in conn.execute("PRAGMA table_info(artifacts)")}
        if "xxh3_128" not in columns:
            conn.execute("ALTER TABLE artifacts ADD COLUMN xxh3_128 TEXT")
        change_seq.migrate(conn)
        conn.execute("UPDATE meta SET v = ? WHERE k = 'schema_version'", (str(SCHEMA_VERSION),))
        conn.execute("COMMIT")
    except BaseException:
        _rollback(conn)
        raise


def _rollback(conn: sqlite3.Connection) -> None:
    """Roll back if a transaction is still open: SQLite has already rolled back by itself
    after some errors (SQLITE_FULL), and a second ROLLBACK would mask the first error."""
    if conn.in_transaction:
        conn.execute("ROLLBACK")
