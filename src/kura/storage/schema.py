"""The metadata index's SQLite schema, its version and migration, and the row shape of a
manifest (``COLUMNS``, ``row_to_manifest``), shared by the index modules (``storage.index``,
``storage.paging``, ``storage.outbox_queries``) and ``storage.change_feed``; and
``write_transaction``, the one write transaction of every storage module.

The schema carries a version in ``meta``; opening the index creates or migrates it in place.
Version 2 added ``artifacts.xxh3_128`` (the fast checksum of ``storage.checksum``, NULL for rows
written before it): an ``ALTER TABLE ... ADD COLUMN``, which rewrites no row
(https://www.sqlite.org/lang_altertable.html#altertabaddcol). A version-1 file opened read-only
(a full disk) is read as it is, every row without a checksum. Version 3 added the change
sequence (``artifacts.seq``, ``tombstones.seq``, ``meta['change_seq']``, ``meta['epoch']``) and
the ``peer_cursors`` table: ``storage.change_seq`` owns them and their migration. Version 4
added provenance (issue 29): ``artifacts.writer`` (who wrote the version, carried by every
manifest read from the index) and ``artifacts.via`` (how a copy reached this node: ``''`` for a
local write, else the internal URL of the peer it came from, or the apply path when no peer
is known, ``object_store``, ``replication``; local only, never replicated), both NULL for older rows and read as ``''``; and the ``purges`` table
(``storage.provenance``). A version-3 or older file opened read-only reads through a temporary view
that adds the two columns as ``''`` (``compat_view``).

Which kura last opened the index for writing is recorded in ``meta['kura_version']``
(``stamp_written_by``, from kura 0.2.0 on; no schema change: kura 0.1.0 reads ``meta`` by key
only and never sees the row, nor updates it). A schema newer than ``SCHEMA_VERSION`` is refused
before anything is written (``refuse_if_too_new``, on a read-only connection that leaves a crashed
writer's ``-wal`` in place), naming that kura and what to do; so is an unparseable schema version
or a populated ``meta`` without one (``written_by``); one no kura writes (0, -1, garbled with no
newer writer recorded) is refused as damaged (``DataDirDamaged``). ``meta['layout']`` records the blob layout
(``stamp_layout``, ``storage.recovery``).

Only ``refuse_if_too_new``, ``peek_kura_version`` and ``peek_layout`` open a connection (their own,
read-only, closed before they return); every other
function takes the caller's.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from kura import __version__
from kura.core.errors import KuraError
from kura.core.manifest import Manifest
from kura.core.versions import (
    DataDirDamaged,
    DataDirTooNew,
    damaged_message,
    is_newer,
    too_new_message,
)
from kura.storage import change_seq
from kura.storage.fsync import disk_full

_T = TypeVar("_T")

SCHEMA_VERSION = 4
# Versions a read-only open accepts as they are (it cannot migrate).
READABLE_SCHEMA_VERSIONS = (1, 2, 3, 4)
# ``meta`` row: the kura version that last opened the index for writing.
KURA_VERSION_KEY = "kura_version"
# ``meta`` row: the blob layout of the data dir, beside its ``layout`` file (``stamp_layout``).
LAYOUT_KEY = "layout"

SCHEMA = """
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
    seq            INTEGER,
    writer         TEXT,
    via            TEXT
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
-- One row per purge of a writer's entries (storage.provenance): held in memory, a handful of rows.
CREATE TABLE IF NOT EXISTS purges (
    namespace_id TEXT NOT NULL,
    writer       TEXT NOT NULL,
    version_ms   INTEGER NOT NULL,
    PRIMARY KEY (namespace_id, writer)
);
CREATE INDEX IF NOT EXISTS outbox_by_peer ON outbox(peer, id);
-- Eviction skips artifacts with a pending object-tier upload (paging.least_recently_used).
CREATE INDEX IF NOT EXISTS outbox_by_artifact ON outbox(artifact_id);
"""

# Age expiry and quota eviction of one namespace (KURA_NAMESPACE_RULES, storage.eviction); with
# size it covers the usage scan (namespace_usage.usage: 0.2 s per million rows, against 2 s
# through artifacts_by_namespace and the table). Every touch flush updates it too, so it exists
# only while rules are set (``namespace_access_index``; docs/durability.md has the figures).
NAMESPACE_ACCESS_INDEX = (
    "CREATE INDEX IF NOT EXISTS artifacts_by_namespace_access "
    "ON artifacts(namespace_id, last_access_ms, version_ms, artifact_id, size)"
)


def namespace_access_index(conn: sqlite3.Connection, wanted: bool) -> None:
    """Create ``artifacts_by_namespace_access`` when ``wanted`` (``KURA_NAMESPACE_RULES`` is
    set; built once, O(rows log rows)), else drop it: a node without rules pays no per-touch
    cost for it. Idempotent; call on the writer's connection of a writable index."""
    conn.execute(
        NAMESPACE_ACCESS_INDEX if wanted else "DROP INDEX IF EXISTS artifacts_by_namespace_access"
    )


COLUMNS = (
    "artifact_id, producer, namespace_id, key, content_type, size, sha256, version_ms, "
    "created_at_ms, inline_body IS NOT NULL, headers, COALESCE(writer, '')"
)
# How many columns ``COLUMNS`` selects (a query selecting more reads them from this position).
N_COLUMNS = 12


def row_to_manifest(row: tuple[object, ...]) -> Manifest:
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
        writer=str(row[11]),
    )


def compat_view(conn: sqlite3.Connection) -> None:
    """On a read-only connection to a file older than version 4 (no ``writer``/``via``
    columns), shadow ``artifacts`` with a temporary view that adds them as ``''``: unqualified
    names resolve to the ``temp`` schema first (https://www.sqlite.org/lang_naming.html), so
    every query reads the file as it is. Call before ``PRAGMA query_only``; a no-op on a
    version-4 file."""
    columns = {str(r[1]) for r in conn.execute("PRAGMA main.table_info(artifacts)")}
    if columns and "writer" not in columns:
        conn.execute(
            "CREATE TEMP VIEW IF NOT EXISTS artifacts AS "
            "SELECT *, '' AS writer, '' AS via FROM main.artifacts"
        )


def written_by(conn: sqlite3.Connection) -> tuple[int | None, str | None]:
    """``(schema_version, kura_version)`` as ``meta`` records them; None for what it does not
    (a fresh file has no ``meta``; kura 0.1.0 recorded no kura version). Only reads. Raises
    ``DataDirTooNew`` for a ``meta`` that holds rows but no ``schema_version`` (every kura writes
    it first, ``MetadataIndex``: a missing one is not a fresh file, which this kura would
    initialise over what is there) or a ``schema_version`` that is not an integer, when the
    recorded writer is a newer kura (a later release's format this kura cannot read,
    ``versions.is_newer``); ``DataDirDamaged`` for one that is not an integer otherwise, or an
    integer below ``READABLE_SCHEMA_VERSIONS`` (0, -1: no kura writes one; migrating it would
    renumber the change feed under a new epoch)."""
    has_meta = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'"
    ).fetchone()
    if has_meta is None:
        return None, None
    rows = {str(k): str(v) for k, v in conn.execute("SELECT k, v FROM meta").fetchall()}
    kura = rows.get(KURA_VERSION_KEY)
    schema = rows.get("schema_version")
    readable = f"{READABLE_SCHEMA_VERSIONS[0]}-{READABLE_SCHEMA_VERSIONS[-1]}"
    if schema is None:
        if rows:
            raise DataDirTooNew(too_new_message("metadata schema", "(none)", readable, kura))
        return None, kura
    if not (schema.isascii() and schema.isdigit() and len(schema) < 10):
        if is_newer(kura):
            raise DataDirTooNew(
                too_new_message("metadata schema", ascii(schema[:40]), readable, kura)
            )
        raise DataDirDamaged(
            damaged_message(
                f"index records metadata schema {schema[:40]!a}", f"schemas {readable}", kura
            )
        )
    if int(schema) < READABLE_SCHEMA_VERSIONS[0]:
        raise DataDirDamaged(
            damaged_message(f"index records metadata schema {schema}", f"schemas {readable}", kura)
        )
    return int(schema), kura


def recorded_layout(conn: sqlite3.Connection) -> str | None:
    """The blob layout the index records (``LAYOUT_KEY``, from kura 0.2.0 on), or None when it
    records none (a fresh file, or written by an older kura). Only reads."""
    has_meta = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'"
    ).fetchone()
    if has_meta is None:
        return None
    row = conn.execute("SELECT v FROM meta WHERE k = ?", (LAYOUT_KEY,)).fetchone()
    return None if row is None else str(row[0])


def stamp_layout(conn: sqlite3.Connection, layout: str) -> None:
    """Record ``layout`` as the data dir's blob layout in ``meta`` (``LAYOUT_KEY``), beside the
    ``layout`` file, so that a data dir whose file is lost is not taken for a fresh one
    (``storage.recovery``). Writes only when the record differs; a write that fails for want
    of space is skipped (the next start records it)."""
    if recorded_layout(conn) == layout:
        return
    try:
        conn.execute("INSERT OR REPLACE INTO meta(k, v) VALUES (?, ?)", (LAYOUT_KEY, layout))
    except sqlite3.OperationalError as exc:
        if not disk_full(exc):
            raise


def too_new(conn: sqlite3.Connection) -> str | None:
    """The refusal message when the index's schema is newer than ``SCHEMA_VERSION``, not an
    integer, below every readable one, or missing from a populated ``meta``; else None
    (``refusal``)."""
    refused = refusal(conn)
    return None if refused is None else refused.message


def refusal(conn: sqlite3.Connection) -> KuraError | None:
    """The refusal (``DataDirTooNew``, ``DataDirDamaged``; ``written_by``) when the index's
    schema cannot be opened by this kura, not raised; else None."""
    try:
        schema, kura = written_by(conn)
    except (DataDirTooNew, DataDirDamaged) as exc:
        return exc
    if schema is None or schema <= SCHEMA_VERSION:
        return None
    readable = f"{READABLE_SCHEMA_VERSIONS[0]}-{READABLE_SCHEMA_VERSIONS[-1]}"
    return DataDirTooNew(too_new_message("metadata schema", str(schema), readable, kura))


def _read_only(path: Path) -> sqlite3.Connection:
    """A connection that writes neither the file nor its WAL. With a non-empty ``-wal`` (a
    writer crashed, or is still open) ``mode=ro``: it reads the commits left there without
    checkpointing them, and its close keeps the ``-wal`` (https://www.sqlite.org/wal.html#readonly);
    only the ``-shm`` index may be created or updated. Without one, ``immutable=1``: every
    commit is in the file, and ``mode=ro`` would leave an empty ``-wal`` and a ``-shm`` behind.
    The caller holds the data dir's writer lock, so no kura writes a ``-wal`` meanwhile."""
    wal = path.with_name(path.name + "-wal")
    mode = "mode=ro" if wal.is_file() and wal.stat().st_size > 0 else "immutable=1"
    return sqlite3.connect(f"file:{path}?{mode}", uri=True, isolation_level=None)


def refuse_if_too_new(path: Path) -> None:
    """Raise ``DataDirTooNew`` when the index at ``path`` has a schema newer than this kura
    (or one it cannot parse, ``written_by``), ``DataDirDamaged`` for one no kura writes, before any writing open (which would create
    tables and indexes in it) and before the ``-wal`` is replayed into the file. Reads ``meta``
    on a read-only connection of its own (``_read_only``), closed before it returns: the file
    and its ``-wal`` are left byte for byte. When that open fails for want of space (no
    ``-shm`` can be made: a full disk) ``meta`` is read with ``immutable=1`` instead, as the
    read-only start does. No-op when there is no file yet."""
    if not path.exists():
        return
    try:
        refused = _read_meta(path, refusal, immutable=False)
    except sqlite3.OperationalError as exc:
        if not (
            exc.sqlite_errorname.startswith("SQLITE_IOERR")
            or exc.sqlite_errorname
            in (
                "SQLITE_FULL",
                "SQLITE_CANTOPEN",
            )
        ):
            raise
        refused = _read_meta(path, refusal, immutable=True)
    if refused is not None:
        raise refused


def _read_meta(path: Path, read: Callable[[sqlite3.Connection], _T], *, immutable: bool) -> _T:
    conn = (
        sqlite3.connect(f"file:{path}?immutable=1", uri=True, isolation_level=None)
        if immutable
        else _read_only(path)
    )
    try:
        return read(conn)
    finally:
        conn.close()


def peek_kura_version(path: Path) -> str | None:
    """The kura version the index at ``path`` records as its last writer, read on a read-only
    connection (``_read_only``: nothing written but the ``-shm``, a commit still only in the
    WAL is seen); None when there is no file, no record, or it cannot be read."""
    if not path.is_file():
        return None
    try:
        return _read_meta(path, _kura_version, immutable=False)
    except (sqlite3.Error, DataDirTooNew, DataDirDamaged):
        return None


def peek_layout(path: Path) -> str | None:
    """The blob layout the index at ``path`` records (``recorded_layout``), read as
    ``peek_kura_version`` reads; None when there is no file, no record, or it cannot be read."""
    if not path.is_file():
        return None
    try:
        return _read_meta(path, recorded_layout, immutable=False)
    except sqlite3.Error:
        return None


def _kura_version(conn: sqlite3.Connection) -> str | None:
    return written_by(conn)[1]


def stamp_written_by(conn: sqlite3.Connection) -> None:
    """Record this kura as the last one to open the index for writing (``KURA_VERSION_KEY``).
    Writes only when the record differs (a restart writes nothing: a full disk must still
    start, ``storage.recovery``); a write that fails for want of space leaves the old record,
    which is advisory: only a refusal's message reads it."""
    if written_by(conn)[1] == __version__:
        return
    try:
        conn.execute(
            "INSERT OR REPLACE INTO meta(k, v) VALUES (?, ?)", (KURA_VERSION_KEY, __version__)
        )
    except sqlite3.OperationalError as exc:
        if not disk_full(exc):
            raise


def migrate_schema(conn: sqlite3.Connection) -> None:
    """Version 1, 2 or 3 to 4 in one transaction: add ``artifacts.xxh3_128`` (NULL for every
    row) if missing, the change sequence (``change_seq.migrate``), then ``artifacts.writer`` and
    ``artifacts.via`` (NULL for every row: ``ADD COLUMN`` rewrites none)."""
    with write_transaction(conn):
        columns = {str(r[1]) for r in conn.execute("PRAGMA table_info(artifacts)")}
        if "xxh3_128" not in columns:
            conn.execute("ALTER TABLE artifacts ADD COLUMN xxh3_128 TEXT")
        version = conn.execute("SELECT v FROM meta WHERE k = 'schema_version'").fetchone()
        if int(version[0]) < 3:  # numbers every row under a new epoch: only once
            change_seq.migrate(conn)
        for column in ("writer", "via"):
            if column not in columns:
                conn.execute(f"ALTER TABLE artifacts ADD COLUMN {column} TEXT")
        conn.execute("UPDATE meta SET v = ? WHERE k = 'schema_version'", (str(SCHEMA_VERSION),))


@contextlib.contextmanager
def write_transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """The one way storage writes in a transaction: ``BEGIN IMMEDIATE`` (the write lock taken
    at once, so the transaction never fails half-way for want of it), ``COMMIT`` when the block
    ends, ``ROLLBACK`` (``rollback``) and re-raise on any exception, the failed ``COMMIT``
    included. Yields ``conn``, whose ``isolation_level`` must be None (manual transactions).
    Durability is the connection's: on the writer thread a COMMIT is made durable by its group
    (``storage.group_commit``, ``docs/durability.md``) before anything is acknowledged."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
        conn.execute("COMMIT")
    except BaseException:
        rollback(conn)
        raise


def rollback(conn: sqlite3.Connection) -> None:
    """Roll back if a transaction is still open: SQLite has already rolled back by itself
    after some errors (SQLITE_FULL), and a second ROLLBACK would mask the first error."""
    if conn.in_transaction:
        conn.execute("ROLLBACK")
