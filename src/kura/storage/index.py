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

The index is split by job: this module opens the file (creating or migrating the schema of
``storage.schema``) and holds the artifact, tombstone and access-time reads and writes;
``storage.paging`` the cursor pages for peers; ``storage.outbox_queries`` the outbox reads
(its vocabulary, ``storage.outbox``, is the one public to the mesh). Only
``kura.storage`` imports these modules (import-linter contract in ``pyproject.toml``).

Durability: the writer thread's connection runs ``synchronous=NORMAL`` (``group_commits``): a
COMMIT does not fsync, and ``storage.group_commit`` fsyncs the WAL before it acknowledges any
(https://www.sqlite.org/pragma.html#pragma_synchronous). The other connections only read and
run ``FULL``. A row acknowledged survives a power loss: ``docs/durability.md``.

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
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from kura.core.errors import Unavailable
from kura.core.manifest import Manifest
from kura.core.versions import DataDirTooNew
from kura.storage import change_seq, digests, provenance, retention
from kura.storage.fsync import WalSync, descriptor_shortage
from kura.storage.outbox import DELETE_NAMESPACE, PURGE_WRITER, UPSERT
from kura.storage.outbox_queries import OutboxQueries
from kura.storage.paging import PagingQueries
from kura.storage.schema import (
    COLUMNS,
    N_COLUMNS,
    READABLE_SCHEMA_VERSIONS,
    SCHEMA,
    SCHEMA_VERSION,
    compat_view,
    migrate_schema,
    namespace_access_index,
    refusal,
    refuse_if_too_new,
    row_to_manifest,
    stamp_layout,
    stamp_written_by,
    too_new,
    write_transaction,
)


class MetadataIndex:
    """SQLite access. Thread-safe: each thread gets its own connection. Its paging and outbox
    queries are ``paging`` and ``outbox`` (``storage.paging``, ``storage.outbox_queries``)."""

    def __init__(self, path: Path, *, read_only: bool = False, check_digests: bool = True) -> None:
        """Open (creating or migrating) the index at ``path``. With ``check_digests`` False the
        range digests are not checked against the row count nor back-filled here (an O(rows)
        scan): the caller runs ``ensure_digests`` before anyone reads them (start-up does, in
        the background, ``recovery.check_index``)."""
        self._path = path
        self.read_only = read_only
        self._check_digests = check_digests
        self._local = threading.local()
        # Every thread's connection, so that close_all closes those of threads that are gone
        # (the reader pool's, the constructing thread's): a process exit would, a node
        # stopped in a longer-lived process must.
        self._opened: list[sqlite3.Connection] = []
        self._opened_lock = threading.Lock()
        self.paging = PagingQueries(self._conn)
        self.outbox = OutboxQueries(self._conn)
        # The expression ``get`` selects for the fast checksum (NULL on a version-1 file).
        self._xxh3_column = "xxh3_128"
        # Every purge of a writer's entries, (namespace, writer) -> version: a handful of rows,
        # held in memory so the version rule's look-up (``covered``) costs no query. Replaced,
        # never changed in place, by the writer thread (``apply_purge``).
        self.purges: dict[tuple[str, str], int] = {}
        # While set, only the thread that holds the index queries it (``hold``).
        self._hold: _Hold | None = None
        # Whether the range digests were checked against the rows (here, or ``ensure_digests``;
        # a read-only index's are served as they are): until then anti-entropy answers 503.
        self.digests_ready = check_digests or read_only
        self._initialise()

    def _initialise(self) -> None:
        if not self.read_only:
            refuse_if_too_new(self._path)  # DataDirTooNew before the writing open changes anything
        conn = self._conn()
        read_only = self.read_only
        if read_only:
            if (refused := refusal(conn)) is not None:
                raise refused
            self.purges = provenance.load_purges(conn)
            row = conn.execute("SELECT v FROM meta WHERE k = 'schema_version'").fetchone()
            if row is None or int(row[0]) not in READABLE_SCHEMA_VERSIONS:
                raise RuntimeError(f"metadata schema {row} cannot be opened read-only")
            if int(row[0]) < 2:
                self._xxh3_column = "NULL"
            return
        conn.executescript(SCHEMA)
        row = conn.execute("SELECT v FROM meta WHERE k = 'schema_version'").fetchone()
        if row is None:
            conn.execute(
                "INSERT INTO meta(k, v) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
            )
            change_seq.initialise(conn)
        elif int(row[0]) > SCHEMA_VERSION:  # a newer kura wrote it since refuse_if_too_new
            raise DataDirTooNew(too_new(conn) or f"metadata schema {row[0]} is too new")
        elif int(row[0]) < SCHEMA_VERSION:
            migrate_schema(conn)
        stamp_written_by(conn)
        conn.executescript(change_seq.SCHEMA)
        conn.commit()
        # anti-entropy range digests, outside the schema version
        digests.ensure(conn, back_fill=self._check_digests)
        retention.ensure(conn)  # promises to keep (storage.retention), outside it too
        self.purges = provenance.load_purges(conn)

    def hold(self, refusal: Callable[[], Unavailable]) -> None:
        """Until ``release``, a query from any thread but the one that claims the hold
        (``claim_hold``; none before) raises ``refusal()`` at once (503 with ``Retry-After``):
        start-up checks the index (``storage.startup_work``) with nobody else using it, so that
        a damaged one can be replaced (``replace_with_fresh``). Nothing waits here, in a
        thread: a read waits on the event loop before it reaches one
        (``StartupWork.wait_readable``), so a query that gets here while held is a read that
        skipped that wait. A thread's query already running is not stopped: hold before anyone
        else queries."""
        self._hold = _Hold(None, refusal)

    def claim_hold(self) -> None:
        """This thread's queries no longer wait (``hold``)."""
        if self._hold is not None:
            self._hold.owner = threading.get_ident()

    def replace_with_fresh(self, set_aside: Callable[[], None]) -> None:
        """Holding thread (``hold``), nobody else querying: close every connection, call
        ``set_aside`` (which moves the index files away, ``recovery``) and create a fresh
        index at the same path, which every thread then opens anew. Closing first matters:
        the last connection to close a WAL database deletes its ``-wal`` file by name, which
        would be the fresh index's."""
        self.close_all()
        self._local = threading.local()
        set_aside()
        self._xxh3_column = "xxh3_128"
        self._check_digests = True  # a fresh index: nothing to scan
        self._initialise()
        self.digests_ready = True

    def ensure_digests(self) -> None:
        """Check the range digests against the row count and back-fill them if they are not
        complete (``digests.ensure``); O(rows). Nothing on a read-only index. Then
        ``digests_ready``; raises ``sqlite3.OperationalError`` (``SQLITE_FULL`` on a full disk)
        with ``digests_ready`` left as it was."""
        if not self.read_only:
            digests.ensure(self._conn())
        self.digests_ready = True

    @property
    def path(self) -> Path:
        """The index file."""
        return self._path

    def release(self) -> None:
        """End ``hold``."""
        self._hold = None

    def _conn(self) -> sqlite3.Connection:
        hold = self._hold
        if hold is not None and hold.owner != threading.get_ident():
            raise hold.refusal()
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is not None:
            return conn
        try:
            return self._open_conn()
        except sqlite3.OperationalError as exc:
            # A thread's first connection opened while the process is short of descriptors
            # fails as "unable to open database file": raise the shortage itself (EMFILE), so
            # every listener answers it as the passing condition it is (503, UNAVAILABLE).
            shortage = descriptor_shortage()
            if shortage is None:
                raise
            raise shortage from exc

    def _open_conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = None
        if self.read_only:
            uri = f"file:{self._path}?immutable=1"
            conn = sqlite3.connect(uri, isolation_level=None, check_same_thread=False, uri=True)
            self._local.conn = conn
            self._keep(conn)
            compat_view(conn)  # a file older than version 4 reads every writer as ''
        else:
            conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
            self._keep(conn)
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=FULL")
                conn.execute("PRAGMA busy_timeout=5000")
            except sqlite3.Error:  # a shortage, say: the next call opens another
                self._drop(conn)
                raise
            self._local.conn = conn
        return conn

    def keep_namespace_access_index(self, wanted: bool) -> None:
        """Create or drop the per-namespace index (``schema.namespace_access_index``). Call on
        the writer thread of a writable index."""
        namespace_access_index(self._conn(), wanted)

    def group_commits(self) -> Callable[[], None]:
        """Call on the writer thread: its COMMITs stop fsyncing (``synchronous=NORMAL``). Returns
        the function that makes every COMMIT so far durable (``fsync.WalSync``)."""
        self._conn().execute("PRAGMA synchronous=NORMAL")
        return WalSync(self._path)

    def connection(self) -> sqlite3.Connection:
        """This thread's connection, for storage modules owning tables of their own
        (``storage.peer_queue``). Same rules: writes on the writer thread only."""
        return self._conn()

    def _keep(self, conn: sqlite3.Connection) -> None:
        with self._opened_lock:
            self._opened.append(conn)

    def close_all(self) -> None:
        """Close every thread's connection (``check_same_thread=False`` allows it; each is
        still used by its own thread only). Call once no thread uses the index any more."""
        with self._opened_lock:
            opened, self._opened = self._opened, []
        for conn in opened:
            conn.close()

    def _drop(self, conn: sqlite3.Connection) -> None:
        """Close ``conn`` and forget it (``close_all`` no longer closes it)."""
        with self._opened_lock, contextlib.suppress(ValueError):
            self._opened.remove(conn)
        conn.close()

    def close_thread_connection(self) -> None:
        """Close this thread's connection and forget it: a thread that opens and closes its
        connection again and again (the start-up work's retries) holds none of them."""
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is not None:
            self._local.conn = None
            self._drop(conn)

    # -- reads -------------------------------------------------------------------------------

    def record_layout(self, layout: str) -> None:
        """Record the data dir's blob layout in ``meta`` (``schema.stamp_layout``); a no-op on
        a read-only index. Start-up only (``storage.recovery``), before the writer thread."""
        if not self.read_only:
            stamp_layout(self._conn(), layout)

    def quick_check(self) -> str:
        """``PRAGMA quick_check``: "ok", or the first problem SQLite found (a damaged page,
        an index out of step with its table). Reads every page: O(file size)."""
        rows = self._conn().execute("PRAGMA quick_check(1)").fetchall()
        return str(rows[0][0]) if rows else "ok"

    def get(self, artifact_id: str) -> tuple[Manifest, bytes | None, str | None, str | None] | None:
        """(manifest, inline body or None, stat signature or None, XXH3-128 hex or None), or
        None if absent, or if the row found names another artifact (only a damaged index
        answers so; ``get_many`` keys its answer by the row's own id)."""
        row = (
            self._conn()
            .execute(
                f"SELECT {COLUMNS}, inline_body, stat_sig, {self._xxh3_column} "
                "FROM artifacts WHERE artifact_id = ?",
                (artifact_id,),
            )
            .fetchone()
        )
        if row is None or row[0] != artifact_id:  # a damaged index may answer another row
            return None
        n = N_COLUMNS
        return row_to_manifest(row), row[n], row[n + 1], row[n + 2]

    def get_many(
        self, artifact_ids: Sequence[str]
    ) -> dict[str, tuple[Manifest, bytes | None, str | None, str | None]]:
        """``get`` for many ids: ``artifact_id -> (manifest, inline body or None, stat
        signature or None, XXH3-128 hex or None)`` for those with a row, one statement per
        500 ids (under SQLite's bound-variable limit, 999 before 3.32)."""
        found: dict[str, tuple[Manifest, bytes | None, str | None, str | None]] = {}
        conn = self._conn()
        for start in range(0, len(artifact_ids), 500):
            chunk = artifact_ids[start : start + 500]
            marks = ",".join("?" * len(chunk))
            for row in conn.execute(
                f"SELECT {COLUMNS}, inline_body, stat_sig, {self._xxh3_column} "
                f"FROM artifacts WHERE artifact_id IN ({marks})",
                chunk,
            ):
                n = N_COLUMNS
                found[str(row[0])] = (row_to_manifest(row), row[n], row[n + 1], row[n + 2])
        return found

    def exists(self, artifact_id: str) -> bool:
        row = (
            self._conn()
            .execute("SELECT 1 FROM artifacts WHERE artifact_id = ?", (artifact_id,))
            .fetchone()
        )
        return row is not None

    def stored_bodies(self, artifact_ids: Sequence[str]) -> dict[str, tuple[int, int, str, bool]]:
        """``artifact_id -> (size, version_ms, sha256, inline)`` for the ids of
        ``artifact_ids`` that have a row (queried in chunks of 500): enough to name a version's
        blob file without reading the rest of its row."""
        found: dict[str, tuple[int, int, str, bool]] = {}
        conn = self._conn()
        for start in range(0, len(artifact_ids), 500):
            chunk = artifact_ids[start : start + 500]
            marks = ",".join("?" * len(chunk))
            for r in conn.execute(
                "SELECT artifact_id, size, version_ms, sha256, inline_body IS NOT NULL "
                f"FROM artifacts WHERE artifact_id IN ({marks})",
                chunk,
            ):
                found[str(r[0])] = (int(r[1]), int(r[2]), str(r[3]), bool(r[4]))
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

    def covered(self, namespace_id: str, writer: str) -> int | None:
        """The version at or below which a copy of ``writer``'s in ``namespace_id`` is ignored:
        the larger of the namespace tombstone and the purge of that writer there (None when
        neither exists). What the version rule (``core.version.decide_apply``) takes as the
        tombstone, and what a local write's version is issued above."""
        tombstone = self.tombstone(namespace_id)
        purge = self.purges.get((namespace_id, writer))
        if purge is None or (tombstone is not None and tombstone >= purge):
            return tombstone
        return purge

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
        via: str = "",
    ) -> int | None:
        """Insert or replace one manifest (with the XXH3-128 of its file's bytes, if known)
        and enqueue it for ``outbox_peers``, atomically; return the size it replaced (None if
        new). ``via``: how the copy came (``''`` for a local write, else the apply path)."""
        return self.upsert_many(
            [(manifest, inline_body, stat_sig, xxh3_128)],
            now_ms,
            dict.fromkeys(outbox_peers, 1),
            via=via,
        )[0]

    def upsert_many(
        self,
        rows: Sequence[tuple[Manifest, bytes | None, str | None, str | None]],
        now_ms: int,
        outbox: Mapping[str, int] | None = None,
        *,
        via: str = "",
    ) -> list[int | None]:
        """``upsert`` for many ``(manifest, inline body, stat signature, XXH3-128)`` rows in one
        transaction (one durable commit), each of ``outbox``'s peers enqueued the first as many
        rows as it maps to (``PeerQueues.admit_many``); return the sizes they replaced, in
        order. The rows
        they replace are read in one statement per 500, the change numbers taken at once and
        the range digests folded once for the whole batch; a row given twice replaces the
        first. Each row records its manifest's ``writer`` and ``via`` (schema version 4)."""
        conn = self._conn()
        replaced: list[int | None] = []
        if not rows:
            return replaced
        with write_transaction(conn):
            current = {
                aid: (size, version, sha)
                for aid, (size, version, sha, _inline) in self.stored_bodies(
                    [r[0].artifact_id for r in rows]
                ).items()
            }
            seq = change_seq.take_seqs(conn, len(rows))
            removed: list[digests.Row] = []
            values = []
            for n, (manifest, inline_body, stat_sig, xxh3_128) in enumerate(rows):
                aid = manifest.artifact_id
                old = current.get(aid)
                replaced.append(None if old is None else old[0])
                if old is not None:
                    removed.append((aid, old[1], old[2]))
                current[aid] = (manifest.size, manifest.version_ms, manifest.sha256)
                values.append(
                    (
                        aid,
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
                        seq + n,
                        manifest.writer,
                        via,
                    )
                )
            conn.executemany(
                "INSERT OR REPLACE INTO artifacts (artifact_id, producer, namespace_id, key, "
                "content_type, size, sha256, version_ms, created_at_ms, last_access_ms, "
                "inline_body, headers, stat_sig, xxh3_128, seq, writer, via) "
                "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                values,
            )
            # A row given twice: the second removes the first (``current``), so the fold of
            # every removal and addition is the batch's net change.
            digests.apply(
                conn, removed, [(m.artifact_id, m.version_ms, m.sha256) for m, *_ in rows]
            )
            conn.executemany(
                "INSERT INTO outbox (peer, kind, artifact_id, version_ms, enqueued_at_ms) "
                "VALUES (?, ?, ?, ?, ?)",
                (
                    (p, UPSERT, m.artifact_id, m.version_ms, now_ms)
                    for p, n in (outbox or {}).items()
                    for m, *_ in rows[:n]
                ),
            )
        return replaced

    def delete(self, artifact_ids: Iterable[str]) -> None:
        conn = self._conn()
        artifact_ids = list(artifact_ids)
        with write_transaction(conn):
            _drop_rows(conn, artifact_ids)

    def apply_tombstone(
        self, namespace_id: str, version_ms: int, now_ms: int, outbox_peers: Sequence[str] = ()
    ) -> list[tuple[str, int, bool]] | None:
        """Raise the namespace tombstone to ``version_ms``, delete the namespace's artifacts and
        the purges it covers at or below it (``provenance.drop_covered``) and enqueue the
        delete for ``outbox_peers``, in one transaction.

        Returns the deleted (artifact_id, size, inline) rows, or None when a tombstone at or
        above ``version_ms`` already existed (nothing changes, nothing is enqueued).
        """
        conn = self._conn()
        with write_transaction(conn):
            row = conn.execute(
                "SELECT version_ms FROM tombstones WHERE namespace_id = ?", (namespace_id,)
            ).fetchone()
            if row is not None and int(row[0]) >= version_ms:
                return None
            conn.execute(
                "INSERT OR REPLACE INTO tombstones(namespace_id, version_ms, seq) VALUES (?, ?, ?)",
                (namespace_id, version_ms, change_seq.next_seq(conn)),
            )
            victims = [
                (str(r[0]), int(r[1]), bool(r[2]))
                for r in conn.execute(
                    "SELECT artifact_id, size, length(inline_body) IS NOT NULL FROM artifacts "
                    "WHERE namespace_id = ? AND version_ms <= ?",  # length: see paging.py
                    (namespace_id, version_ms),
                )
            ]
            _drop_rows(conn, [v[0] for v in victims])
            provenance.drop_covered(conn, namespace_id, version_ms)
            conn.executemany(
                "INSERT INTO outbox (peer, kind, namespace_id, version_ms, enqueued_at_ms) "
                "VALUES (?, ?, ?, ?, ?)",
                ((p, DELETE_NAMESPACE, namespace_id, version_ms, now_ms) for p in outbox_peers),
            )
        self.purges = {  # once committed
            key: v for key, v in self.purges.items() if key[0] != namespace_id or v > version_ms
        }
        return victims

    def apply_purge(
        self,
        namespace_id: str,
        writer: str,
        version_ms: int,
        now_ms: int,
        outbox_peers: Sequence[str] = (),
    ) -> list[tuple[str, int, bool]] | None:
        """Record the purge of ``writer``'s entries of ``namespace_id`` at ``version_ms``,
        delete them at or below it and enqueue the purge for ``outbox_peers``, in one
        transaction: ``apply_tombstone`` for one writer's rows. Returns the deleted
        (artifact_id, size, inline) rows, or None when a purge of that writer there at or above
        ``version_ms`` already existed (nothing changes, nothing is enqueued)."""
        conn = self._conn()
        with write_transaction(conn):
            victims = provenance.apply_purge(conn, namespace_id, writer, version_ms)
            if victims is None:
                return None
            _drop_rows(conn, [v[0] for v in victims])
            conn.executemany(
                "INSERT INTO outbox (peer, kind, artifact_id, namespace_id, version_ms, "
                "enqueued_at_ms) VALUES (?, ?, ?, ?, ?, ?)",
                ((p, PURGE_WRITER, writer, namespace_id, version_ms, now_ms) for p in outbox_peers),
            )
        self.purges = {**self.purges, (namespace_id, writer): version_ms}  # once committed
        return victims

    def touch(self, accesses: dict[str, int]) -> None:
        """Record last access times (batched from memory)."""
        with write_transaction(self._conn()) as conn:
            conn.executemany(
                "UPDATE artifacts SET last_access_ms = MAX(last_access_ms, ?) WHERE artifact_id = ?",
                ((ms, a) for a, ms in accesses.items()),
            )

    def set_stat_sig(self, artifact_id: str, stat_sig: str) -> None:
        """Record a verified file's stat signature. Best effort: it only saves a re-hash, so a
        failed write (a full disk) is ignored and the next read hashes again."""
        if self.read_only:
            return
        with contextlib.suppress(sqlite3.OperationalError):
            self._conn().execute(
                "UPDATE artifacts SET stat_sig = ? WHERE artifact_id = ?", (stat_sig, artifact_id)
            )

    def set_xxh3_128(self, found: Iterable[tuple[Manifest, str]]) -> None:
        """Record, for each ``(manifest, xxh3_128)``, the XXH3-128 of bytes that were just
        verified to hash to ``manifest.sha256`` (rows written before schema 2), in one
        statement. Only the row of exactly that version without a checksum changes, so a newer
        version written meanwhile is never given another version's checksum. Best effort, like
        ``set_stat_sig``."""
        if self.read_only:
            return
        rows = [(x, m.artifact_id, m.version_ms, m.sha256, m.size) for m, x in found]
        with contextlib.suppress(sqlite3.OperationalError):
            self._conn().executemany(
                "UPDATE artifacts SET xxh3_128 = ? WHERE artifact_id = ? AND version_ms = ? "
                "AND sha256 = ? AND size = ? AND xxh3_128 IS NULL",
                rows,
            )


def _drop_rows(conn: sqlite3.Connection, artifact_ids: list[str]) -> None:
    """Inside the caller's transaction: delete the rows of ``artifact_ids`` and take them out of
    the range digests (a delete, a namespace tombstone's victims, a purge's)."""
    digests.apply(conn, digests.rows_of(conn, artifact_ids), ())
    conn.executemany("DELETE FROM artifacts WHERE artifact_id = ?", ((a,) for a in artifact_ids))


class _Hold:
    """``MetadataIndex.hold``: who holds the index, and what everyone else gets."""

    def __init__(self, owner: int | None, refusal: Callable[[], Unavailable]) -> None:
        self.owner = owner
        self.refusal = refusal
